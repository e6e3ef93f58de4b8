"""Who a request belongs to: session, trajectory and harness, the same way for every API.

Each field is taken from the first source that has it, in this order:

1. the body's ``nvext.agent_context`` (``session_type_id``, ``session_id``, ``trajectory_id``,
   ``parent_trajectory_id``, ``parent_session_id``; Dynamo's field names) — on the gRPC edge, the
   request's own ``Identity``;
2. generic headers: ``x-session-id``, ``x-trajectory-id``, ``x-parent-session-id``,
   ``x-parent-trajectory-id`` (Dynamo's ``x-dynamo-session-id`` / ``x-dynamo-parent-session-id`` too);
3. each harness's own headers:
   Claude Code ``X-Claude-Code-Session-Id`` is the session, ``X-Claude-Code-Agent-Id`` (sent by
   sub-agents) the trajectory and ``X-Claude-Code-Parent-Agent-Id`` its parent, else the session's main
   agent (Claude Code 2.1.330 sends its sub-agents' requests with the parent's session id and their own
   agent id, e.g. ``a1ef6cc7e38183338``, and no parent header: its sub-agents are the main agent's
   children, ``max_depth`` 1; see tests/e2e/test_claude_code_subagents.py); Codex ``thread-id``
   is the trajectory and ``x-codex-parent-thread-id`` (a sub-agent's parent thread) the session and
   parent trajectory, a top-level thread being its own session; then the Anthropic body's
   ``metadata.user_id`` (Claude Code's JSON ``{"session_id": ...}`` or the older
   ``user_..._session_<id>``) and the Responses body's ``prompt_cache_key``;
4. nothing: a fresh ``sess-<hex>`` per request, so nothing is unkeyed (marked ``anonymous``: per-session
   state such as the parse service's prefix watch skips it).

A missing trajectory is the session itself (the main agent's line of turns). The harness name is
``x-harnessmesh-harness`` or derived from the User-Agent.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Protocol

from services.api import common_pb2

# (User-Agent substring, harness name); first match wins.
_HARNESSES: tuple[tuple[str, str], ...] = (
    ("claude-cli", "claude-code"),
    ("claude-code", "claude-code"),
    ("codex", "codex"),
    ("opencode", "opencode"),
    ("openai/python", "openai-python"),
    ("anthropic/python", "anthropic-python"),
    ("openai/js", "openai-node"),
    ("anthropic/js", "anthropic-node"),
)


def harness_name(user_agent: str) -> str:
    """A short harness name from a User-Agent (``OpenAI/Python 3.54.0`` -> ``openai-python``)."""
    lowered = user_agent.strip().lower()
    if not lowered:
        return ""
    for needle, name in _HARNESSES:
        if needle in lowered:
            return name
    return lowered.split()[0].split("/")[0]


class AgentContext(Protocol):
    """``nvext.agent_context`` as any API's model holds it (fields may be None)."""

    session_type_id: str | None
    session_id: str | None
    trajectory_id: str | None
    parent_session_id: str | None
    parent_trajectory_id: str | None


@dataclass
class _Ids:
    session_id: str = ""
    trajectory_id: str = ""
    parent_session_id: str = ""
    parent_trajectory_id: str = ""
    session_type_id: str = ""

    def fill(self, other: _Ids) -> None:
        for name in _ID_FIELDS:
            if not getattr(self, name):
                setattr(self, name, getattr(other, name))


_ID_FIELDS = tuple(f.name for f in fields(_Ids))


def _first_values(headers: Mapping[str, str]) -> Mapping[str, str]:
    """``headers`` as a plain dict (a header sent twice keeps its first value, as Starlette's ``Headers``
    reads it): a dozen lookups in it cost less than a dozen scans of the raw header list."""
    if isinstance(headers, dict):
        return headers
    plain: dict[str, str] = {}
    for name, value in headers.items():
        plain.setdefault(name, value)
    return plain


def _get(headers: Mapping[str, str], *names: str) -> str:
    for name in names:
        value = headers.get(name, "")
        if value and value.strip():
            return value.strip()
    return ""


def _from_context(ctx: AgentContext | common_pb2.Identity | None) -> _Ids:
    if ctx is None:
        return _Ids()
    return _Ids(*(str(getattr(ctx, name, "") or "") for name in _ID_FIELDS))


def _from_generic_headers(headers: Mapping[str, str]) -> _Ids:
    return _Ids(
        session_id=_get(headers, "x-session-id", "x-dynamo-session-id"),
        trajectory_id=_get(headers, "x-trajectory-id"),
        parent_session_id=_get(headers, "x-parent-session-id", "x-dynamo-parent-session-id"),
        parent_trajectory_id=_get(headers, "x-parent-trajectory-id"),
    )


def _from_claude_code(headers: Mapping[str, str]) -> _Ids:
    session, agent = _get(headers, "x-claude-code-session-id"), _get(headers, "x-claude-code-agent-id")
    # A sub-agent without a parent header is the main agent's child: the main agent's trajectory is the session.
    parent = _get(headers, "x-claude-code-parent-agent-id") or (session if agent and agent != session else "")
    return _Ids(session_id=session, trajectory_id=agent, parent_trajectory_id=parent)


def _from_codex(headers: Mapping[str, str]) -> _Ids:
    thread = _get(headers, "thread-id", "session-id")
    parent = _get(headers, "x-codex-parent-thread-id")
    return _Ids(session_id=parent or thread, trajectory_id=thread or parent, parent_trajectory_id=parent)


def session_from_user_id(user_id: str | None) -> str:
    """The session embedded in Anthropic ``metadata.user_id`` (Claude Code's formats), or ``""``."""
    if not user_id:
        return ""
    try:
        parsed = json.loads(user_id)
    except json.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("session_id"), str):
        return str(parsed["session_id"])
    if "_session_" in user_id:  # older Claude Code: user_<hash>_account_<uuid>_session_<uuid>
        return user_id.rsplit("_session_", 1)[1]
    return ""


def resolve_identity(
    headers: Mapping[str, str],
    context: AgentContext | common_pb2.Identity | None = None,
    *,
    user_id: str | None = None,
    prompt_cache_key: str | None = None,
) -> common_pb2.Identity:
    """The request's identity by the precedence in the module docstring (never empty)."""
    headers = _first_values(headers)
    ids = _from_context(context)
    for source in (_from_generic_headers(headers), _from_claude_code(headers), _from_codex(headers),
                   _Ids(session_id=session_from_user_id(user_id)), _Ids(session_id=prompt_cache_key or "")):
        ids.fill(source)
    anonymous = not ids.session_id
    if anonymous:
        ids.session_id = "sess-" + uuid.uuid4().hex
    if not ids.trajectory_id:
        ids.trajectory_id = ids.session_id
    own = context.harness if isinstance(context, common_pb2.Identity) else ""
    harness = own or _get(headers, "x-harnessmesh-harness") or harness_name(headers.get("user-agent", ""))
    return common_pb2.Identity(
        session_id=ids.session_id, trajectory_id=ids.trajectory_id, parent_session_id=ids.parent_session_id,
        harness=harness, session_type_id=ids.session_type_id, parent_trajectory_id=ids.parent_trajectory_id,
        anonymous=anonymous,
    )
