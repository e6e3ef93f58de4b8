"""Why a session's prompt stopped extending its previous turn: a prefix break's cause, from the conversations.

The prefix watch finds *where* the new prompt's tokens leave the previous turn's prompt + output; this
module says *why*, comparing the two conversations message by message (``TurnShape``: the messages,
tools and cache salt a prompt was rendered from, and the assistant message the model produced):

- ``cache_salt``: the request's cache salt changed (every block hash changes with it);
- ``tools_changed``: the tool list or a tool's schema changed;
- ``billing_line``: a system message differs only in Claude Code's ``x-anthropic-billing-header:`` line
  (the service's strip was off for it);
- ``system_changed``: the first (system) message changed otherwise;
- ``output_rewritten``: the client sent back something other than what the model produced;
- ``reasoning_dropped``: an assistant message came back without its reasoning, or came back whole and the
  template's replay policy dropped the reasoning of earlier turns (every message equal, the rendering not);
- ``message_edited`` (index, role): one earlier message changed;
- ``history_rewritten``: several earlier messages changed or were removed (compaction, a harness that
  rewrites earlier turns); a turn sent again without the model's answer (a retry) removes nothing;
- ``inline_system_moved``: every message equal, and the conversation has an inline system message the
  template placed somewhere else (hoisted into the first system block);
- ``unknown``: none of these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.parse.conversation import ChatMessage, ReasoningPart, TextPart, ToolSpec, strip_billing_header

CAUSES = ("billing_line", "inline_system_moved", "system_changed", "tools_changed", "reasoning_dropped",
          "history_rewritten", "message_edited", "output_rewritten", "cache_salt", "unknown")
_SYSTEM_ROLES = ("system", "developer")


@dataclass(frozen=True)
class TurnShape:
    """What a prompt was rendered from, as far as a break's cause is concerned."""

    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    cache_salt: str = ""


@dataclass(frozen=True)
class Cause:
    """A break's cause; ``index`` / ``role``: the first message that differs (-1 / "": none does)."""

    cause: str
    index: int = -1
    role: str = ""


def _text(message: ChatMessage) -> str:
    return "".join(p.text for p in message.parts if isinstance(p, TextPart))


def _without_reasoning(message: ChatMessage) -> ChatMessage:
    parts = tuple(p for p in message.parts if not isinstance(p, ReasoningPart))
    return ChatMessage(message.role, parts, message.tool_call_id, message.name, message.is_error)


def _has_reasoning(message: ChatMessage) -> bool:
    return any(isinstance(p, ReasoningPart) and p.text for p in message.parts)


def _reasoning_dropped(old: ChatMessage, new: ChatMessage) -> bool:
    return _has_reasoning(old) and not _has_reasoning(new) and _without_reasoning(old) == _without_reasoning(new)


def _same_but_billing(old: ChatMessage, new: ChatMessage) -> bool:
    return (old.role == new.role and old.role in _SYSTEM_ROLES
            and strip_billing_header(_text(old)) == strip_billing_header(_text(new)))


def explain(previous: TurnShape | None, output: ChatMessage | None, new: TurnShape) -> Cause:
    """The cause of a break of ``new`` against ``previous`` (whose turn produced ``output``)."""
    if previous is None:
        return Cause("unknown")
    if previous.cache_salt != new.cache_salt:
        return Cause("cache_salt")
    if previous.tools != new.tools:
        return Cause("tools_changed")
    old: Sequence[ChatMessage] = (*previous.messages, *((output,) if output is not None else ()))
    produced = len(previous.messages) if output is not None else -1
    for i, (was, now) in enumerate(zip(old, new.messages, strict=False)):
        if was == now:
            continue
        if _reasoning_dropped(was, now):
            return Cause("reasoning_dropped", i, now.role)
        if i == produced:
            return Cause("output_rewritten", i, now.role)
        if _same_but_billing(was, now):
            return Cause("billing_line", i, now.role)
        if i == 0 and was.role in _SYSTEM_ROLES and now.role in _SYSTEM_ROLES:
            return Cause("system_changed", i, now.role)
        rest = zip(old[i + 1:], new.messages[i + 1:], strict=False)  # the model's output aside: named above
        if len(new.messages) < len(previous.messages) or any(
                a != b for j, (a, b) in enumerate(rest, i + 1) if j != produced):
            return Cause("history_rewritten", i, now.role)
        return Cause("message_edited", i, now.role)
    if len(new.messages) < len(previous.messages):
        return Cause("history_rewritten", len(new.messages), "")
    # every message the client sent is what it sent (or the model said) before: the rendering moved
    inline = next((i for i, m in enumerate(new.messages) if i and m.role in _SYSTEM_ROLES), -1)
    if inline >= 0:
        return Cause("inline_system_moved", inline, new.messages[inline].role)
    reasoned = next((i for i, m in enumerate(old) if m.role == "assistant" and _has_reasoning(m)), -1)
    if reasoned >= 0:
        return Cause("reasoning_dropped", reasoned, "assistant")
    return Cause("unknown")
