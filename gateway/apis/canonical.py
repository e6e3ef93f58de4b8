"""What every API's converter shares on the way to the canonical ``ChatRequest``.

Identity and scheduling hints (one precedence for all APIs), sampling parameters (unset stays unset,
so the model's defaults apply) and the tool-choice modes the APIs have in common. Each API keeps its
own field names and error wording in its ``convert.py``; the logic is here once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from gateway.identity import AgentContext, resolve_identity
from services.api import chat_pb2, common_pb2
from services.common.errors import InvalidRequestError


class AgentHints(Protocol):
    """``nvext.agent_hints`` as any API's model holds it (fields may be None)."""

    priority: int | None
    osl: int | None
    speculative_prefill: bool | None


def _header_int(headers: Mapping[str, str], name: str) -> int | None:
    raw = headers.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidRequestError(f"header {name} must be an integer, got {raw!r}", param=name) from None


def _header_bool(headers: Mapping[str, str], name: str) -> bool | None:
    raw = headers.get(name)
    if raw is None or not raw.strip():
        return None
    return raw.strip().lower() in ("1", "true", "yes", "on")


def identity_and_hints(
    headers: Mapping[str, str], context: AgentContext | None, hints: AgentHints | None, *,
    user_id: str | None = None, prompt_cache_key: str | None = None, closes_session: bool = False,
) -> tuple[common_pb2.Identity, common_pb2.AgentHints]:
    """Identity by ``gateway.identity``'s precedence; ``nvext.agent_hints`` win over the ``x-harnessmesh-*`` headers.
    The request closes its session (``hints.session_final``: its KV blocks go first, docs/agent-kv.md) when the
    body says so (``closes_session``: ``nvext.session_control.action`` ``"close"``, ``nvext.agent_context.
    session_final``) or Dynamo's ``X-Dynamo-Session-Final: true`` header does."""
    identity = resolve_identity(headers, context, user_id=user_id, prompt_cache_key=prompt_cache_key)
    priority = _hint(hints, headers, "priority")
    osl = _hint(hints, headers, "osl")
    spec = hints.speculative_prefill if hints is not None and hints.speculative_prefill is not None else \
        _header_bool(headers, "x-harnessmesh-speculative-prefill")
    final = closes_session or header_closes_session(headers)
    return identity, common_pb2.AgentHints(priority=priority or 0, osl=osl or 0, speculative_prefill=bool(spec),
                                           session_final=final)


def header_closes_session(headers: Mapping[str, str]) -> bool:
    """Dynamo's ``X-Dynamo-Session-Final: true``: the client's last request of its session."""
    return bool(_header_bool(headers, "x-dynamo-session-final"))


def _hint(hints: AgentHints | None, headers: Mapping[str, str], name: str) -> int | None:
    """An integer hint from ``nvext.agent_hints`` else its ``x-harnessmesh-*`` header; beyond 32 bits is a 400."""
    value: int | None = getattr(hints, name) if hints is not None else None
    param = f"nvext.agent_hints.{name}"
    if value is None:
        param = f"x-harnessmesh-{name}"
        value = _header_int(headers, param)
    _in_range(param, value, -_INT32_MAX - 1, _INT32_MAX)
    return value


def sampling_params(
    *, max_tokens: int = 0, stop: Iterable[str] = (), temperature: float | None = None, top_p: float | None = None,
    top_k: int | None = None, seed: int | None = None, ignore_eos: bool = False,
) -> common_pb2.SamplingParams:
    """The canonical sampling parameters; a value the client left out stays unset (the model's default).

    Out-of-range integers are a 400 naming the field; a ``max_tokens`` beyond 32 bits is the largest one
    (the parse service fits it to the context anyway).
    """
    if max_tokens < 0:
        raise InvalidRequestError(f"max_tokens must not be negative, got {max_tokens}", param="max_tokens")
    max_tokens = min(max_tokens, _INT32_MAX)
    _in_range("top_k", top_k, -1, _INT32_MAX)
    _in_range("seed", seed, -(2**63), 2**63 - 1)
    sampling = common_pb2.SamplingParams(max_tokens=max_tokens, stop=list(stop), ignore_eos=ignore_eos)
    if temperature is not None:
        sampling.temperature = temperature
    if top_p is not None:
        sampling.top_p = top_p
    if top_k is not None:
        sampling.top_k = top_k
    if seed is not None:
        sampling.seed = seed
    return sampling


_INT32_MAX = 2**31 - 1


def _in_range(name: str, value: int | None, low: int, high: int) -> None:
    if value is not None and not low <= value <= high:
        raise InvalidRequestError(f"{name} must be between {low} and {high}, got {value}", param=name)


def with_content(message: chat_pb2.Message) -> chat_pb2.Message:
    """``message`` with a text part "" appended when it has none (and is an assistant turn), in place.

    For the APIs whose messages always carry content (Anthropic Messages, Responses): their assistant turn
    is the OpenAI form's ``content: ""`` when it has no text (docs/conversation-mapping.md), which templates
    that read ``message.content`` (Qwen3's, DeepSeek's) need; the OpenAI chat API keeps null as no content.
    """
    if message.role == "assistant" and not any(p.WhichOneof("kind") == "text" for p in message.parts):
        message.parts.append(chat_pb2.Part(text=""))
    return message


def mode_tool_choice(mode: str, tools: Sequence[chat_pb2.Tool]) -> chat_pb2.ToolChoice:
    """``"auto"`` / ``"none"`` / ``"required"`` (the OpenAI APIs' string form); ``required`` needs tools."""
    if mode == "required" and not tools:
        raise InvalidRequestError("tool_choice=required needs tools", param="tool_choice")
    return chat_pb2.ToolChoice(mode=mode)


def named_tool_choice(name: str | None, tools: Sequence[chat_pb2.Tool], *, param: str) -> chat_pb2.ToolChoice:
    """One named tool, which must be one of the request's tools."""
    if not name or name not in {t.name for t in tools}:
        raise InvalidRequestError(f"tool_choice names {name!r}, which is not in tools", param=param)
    return chat_pb2.ToolChoice(mode="named", name=name)
