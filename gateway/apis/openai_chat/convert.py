"""OpenAI chat request (pydantic) + HTTP headers -> the canonical ``ChatRequest``.

The same conversion feeds ``/v1/chat/completions`` and ``/tokenize``, so the tokens reported by
``/tokenize`` are exactly those a chat request sends the worker.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from gateway.apis.openai_chat.models import (
    AgentContextIn,
    AgentHintsIn,
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    NamedToolChoice,
    ToolDef,
)
from gateway.identity import resolve_identity
from services.api import chat_pb2, common_pb2
from services.common.errors import InvalidRequestError


def _content_text(content: str | list[ContentPart] | None, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type not in ("text", "input_text", "output_text"):
            raise InvalidRequestError(
                f"content part type {part.type!r} is not supported (only text)", param=f"{param}[{j}].type"
            )
        texts.append(part.text or "")
    return "".join(texts)


def convert_message(msg: ChatMessage, i: int) -> chat_pb2.Message:
    """One OpenAI message as a canonical message with ordered parts."""
    param = f"messages[{i}]"
    out = chat_pb2.Message(role=msg.role)
    text = _content_text(msg.content, f"{param}.content")
    if msg.role == "assistant":
        reasoning = msg.reasoning_content or msg.reasoning
        if reasoning:
            out.parts.append(chat_pb2.Part(reasoning=reasoning))
        if text:
            out.parts.append(chat_pb2.Part(text=text))
        for j, call in enumerate(msg.tool_calls or ()):
            args = call.function.arguments
            args_json = args if isinstance(args, str) else json.dumps(args)
            out.parts.append(
                chat_pb2.Part(
                    tool_call=chat_pb2.ToolCall(
                        id=call.id or f"call_{i}_{j}", name=call.function.name, arguments_json=args_json
                    )
                )
            )
        return out
    if msg.role == "tool":
        if not msg.tool_call_id:
            raise InvalidRequestError("tool messages need a tool_call_id", param=f"{param}.tool_call_id")
        out.tool_call_id = msg.tool_call_id
        if msg.name:
            out.name = msg.name
    out.parts.append(chat_pb2.Part(text=text))
    return out


def convert_tools(tools: Sequence[ToolDef] | None) -> list[chat_pb2.Tool]:
    return [
        chat_pb2.Tool(
            name=t.function.name,
            description=t.function.description or "",
            parameters_json=json.dumps(t.function.parameters or {"type": "object", "properties": {}}),
        )
        for t in tools or ()
    ]


def convert_tool_choice(
    choice: str | NamedToolChoice | None, tools: Sequence[chat_pb2.Tool]
) -> chat_pb2.ToolChoice:
    if choice is None:
        return chat_pb2.ToolChoice(mode="auto")
    if isinstance(choice, str):
        if choice == "required" and not tools:
            raise InvalidRequestError("tool_choice=required needs tools", param="tool_choice")
        return chat_pb2.ToolChoice(mode=choice)
    name = choice.function.name
    if name not in {t.name for t in tools}:
        raise InvalidRequestError(f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
    return chat_pb2.ToolChoice(mode="named", name=name)


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
    headers: Mapping[str, str], context: AgentContextIn | None, hints: AgentHintsIn | None, *,
    user_id: str | None = None, prompt_cache_key: str | None = None,
) -> tuple[common_pb2.Identity, common_pb2.AgentHints]:
    """Identity by ``gateway.identity``'s precedence; ``nvext.agent_hints`` win over the ``x-harnessmesh-*`` headers."""
    identity = resolve_identity(headers, context, user_id=user_id, prompt_cache_key=prompt_cache_key)
    h = hints or AgentHintsIn()
    priority = h.priority if h.priority is not None else _header_int(headers, "x-harnessmesh-priority")
    osl = h.osl if h.osl is not None else _header_int(headers, "x-harnessmesh-osl")
    spec = (
        h.speculative_prefill
        if h.speculative_prefill is not None
        else _header_bool(headers, "x-harnessmesh-speculative-prefill")
    )
    return identity, common_pb2.AgentHints(priority=priority or 0, osl=osl or 0, speculative_prefill=bool(spec))


def chat_request(
    body: ChatCompletionRequest, headers: Mapping[str, str], *, model: str, request_id: str
) -> chat_pb2.ChatRequest:
    """The canonical request for an OpenAI chat completion request."""
    tools = convert_tools(body.tools)
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or ())
    sampling = common_pb2.SamplingParams(
        max_tokens=body.max_completion_tokens or body.max_tokens or 0, stop=stop, ignore_eos=body.ignore_eos
    )
    if body.temperature is not None:
        sampling.temperature = body.temperature
    if body.top_p is not None:
        sampling.top_p = body.top_p
    if body.top_k is not None:
        sampling.top_k = body.top_k
    if body.seed is not None:
        sampling.seed = body.seed
    nvext = body.nvext
    identity, hints = identity_and_hints(
        headers, nvext.agent_context if nvext else None, nvext.agent_hints if nvext else None
    )
    return chat_pb2.ChatRequest(
        request_id=request_id,
        model=model,
        messages=[convert_message(m, i) for i, m in enumerate(body.messages)],
        tools=tools,
        tool_choice=convert_tool_choice(body.tool_choice, tools),
        sampling=sampling,
        identity=identity,
        hints=hints,
        chat_template_kwargs_json=json.dumps(body.chat_template_kwargs) if body.chat_template_kwargs else "",
        add_generation_prompt=body.add_generation_prompt and not body.continue_final_message,
        continue_final_message=body.continue_final_message,
    )
