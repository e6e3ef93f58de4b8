"""Per-session prefix-break tracking: does each new prompt extend the previous turn's prompt + output?

An agent's prompt should only ever grow by appending: turn N+1 = turn N's prompt + its output + the
new messages. When it does not (a per-request header in the system prompt, a template that drops
history reasoning, a client that rewrites a tool call), everything after the first differing token
is a prefix-cache miss. ``PrefixWatch`` keeps, per session, the token history of the latest turns and
reports where the new prompt broke away from the closest one (a prompt that lies wholly inside a history,
a retry, is no break: every token of it is cached): the token offset and ~80 characters of
text around it, and why (``break_cause.py``: the cause, with the first message that differs, from the
conversations the two prompts were rendered from), as a span event (``prefix.break``, and the span's
``prefix.break_cause`` attribute), a structured log line (``parse.prefix_break``) and a call of
``on_break`` (the service counts it: ``harnessmesh_parse_prefix_breaks{in_output, cause}``).

A session may run several lines of turns (sub-agents, side calls such as title generation); the
watch keeps the last ``lines_per_session`` histories of a session and a prompt that extends any of
them is not a break. A prompt that shares less than ``min_shared_tokens`` with every history starts a
new line (nothing to compare against) rather than being reported; by default any shared token counts,
so a header that changes the very first line of the system prompt is reported too. A harness that
runs sub-agents under one session id should name their trajectories (``x-trajectory-id``): the key is
session + trajectory. Pure domain code: tokens in, a
report out; ``decode`` turns token ids back into text for the report.

The histories live in this process's memory; :meth:`PrefixWatch.histories` and :meth:`PrefixWatch.restore`
hand a session's to and from ``prefix_state.py``, which shares them between parse replicas through a
NATS JetStream bucket (a session's next turn may land on another replica; see docs/state.md).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog
from opentelemetry import trace

from services.common.sequences import common_prefix
from services.parse.break_cause import Cause, TurnShape, explain
from services.parse.conversation import ChatMessage

log = structlog.get_logger()

CONTEXT_CHARS = 80


@dataclass(frozen=True)
class PrefixBreak:
    """Where a session's new prompt stopped extending its previous turn."""

    session: str
    offset: int  # first token of the new prompt that differs from the history
    history_tokens: int  # previous prompt + output
    prompt_tokens: int
    expected: str  # ~80 characters of the history around the offset
    actual: str  # ~80 characters of the new prompt around the offset
    in_output: bool  # the break is inside the previous turn's output (the client changed what the model said)
    cause: str = "unknown"  # why (break_cause.py)
    message_index: int = -1  # the first message of the new conversation that differs (-1: none)
    message_role: str = ""


@dataclass(frozen=True)
class History:
    """One line of a session: the latest turn's prompt + output token ids."""

    tokens: array[int]  # prompt + output
    prompt_len: int
    shape: TurnShape | None = None  # what the prompt was rendered from (None: not known, e.g. from another replica)
    output: ChatMessage | None = None  # the turn's output as a message


@dataclass
class Turn:
    """One request of a session: collects the output tokens; ``commit`` makes it the session's history."""

    watch: PrefixWatch
    session: str
    prompt: array[int]  # never mutated (it may be the prompt cache's own)
    line: History | None  # the history this turn extends (None: a new line)
    output: list[int] = field(default_factory=list)
    shape: TurnShape | None = None

    def extend(self, token_ids: Sequence[int]) -> None:
        self.output.extend(token_ids)

    def commit(self, message: ChatMessage | None = None) -> None:
        """Make the turn (its output ``message``, when known) the session's history."""
        self.watch._commit(self, message)


class PrefixWatch:
    """Tracks prompt-prefix stability per session (bounded: least recently used sessions are dropped)."""

    def __init__(
        self,
        decode: Callable[[list[int]], str],
        *,
        max_sessions: int = 4096,
        lines_per_session: int = 4,
        min_shared_tokens: int = 1,
        on_break: Callable[[PrefixBreak], None] | None = None,
    ) -> None:
        self._decode = decode
        self._max_sessions = max_sessions
        self._lines = lines_per_session
        self._min_shared = min_shared_tokens
        self._sessions: OrderedDict[str, list[History]] = OrderedDict()
        self._on_break = on_break
        self.breaks: list[PrefixBreak] = []  # the latest reports (bounded), for tests and debugging

    def begin(self, session: str, prompt: Sequence[int], *, report: bool = True,
              shape: TurnShape | None = None) -> Turn | None:
        """Check ``prompt`` against the session's histories and report a break; None without a session.

        ``report=False``: the turn is a stream resumed on this replica, whose break (if any) the first one
        reported already. ``shape``: what ``prompt`` was rendered from (a break's cause is named from it)."""
        if not session:
            return None
        tokens = prompt if isinstance(prompt, array) and prompt.typecode == "I" else array("I", prompt)
        histories = self._sessions.get(session, [])
        best, best_shared = -1, 0
        for i, history in enumerate(histories):
            shared = common_prefix(history.tokens, tokens)
            if shared == len(tokens) < len(history.tokens):  # the whole prompt is cached (a retry): no break
                return Turn(self, session, tokens, history, shape=shape)
            if shared == len(history.tokens):
                if report and history.shape is not None and shape is not None and _salt(history.shape) != _salt(shape):
                    self._report(session, history, tokens, 0, shape)  # another cache salt: every block hash differs
                return Turn(self, session, tokens, history, shape=shape)
            if shared > best_shared:
                best, best_shared = i, shared
        if best >= 0 and best_shared >= self._min_shared:
            if report:
                self._report(session, histories[best], tokens, best_shared, shape)
            return Turn(self, session, tokens, histories[best], shape=shape)
        return Turn(self, session, tokens, None, shape=shape)

    def _report(self, session: str, history: History, prompt: array[int], offset: int,
                shape: TurnShape | None) -> None:
        why = explain(history.shape, history.output, shape) if shape is not None else Cause("unknown")
        report = PrefixBreak(
            session=session,
            offset=offset,
            history_tokens=len(history.tokens),
            prompt_tokens=len(prompt),
            expected=self._around(history.tokens, offset),
            actual=self._around(prompt, offset),
            in_output=offset >= history.prompt_len,
            cause=why.cause,
            message_index=why.index,
            message_role=why.role,
        )
        self.breaks = [*self.breaks[-63:], report]
        if self._on_break is not None:
            self._on_break(report)
        trace.get_current_span().add_event("prefix.break", {
            "session.id": session, "prefix.offset": offset, "prefix.history_tokens": report.history_tokens,
            "prefix.expected": report.expected, "prefix.actual": report.actual, "prefix.in_output": report.in_output,
            "prefix.cause": why.cause, "prefix.message_index": why.index, "prefix.message_role": why.role,
        })
        trace.get_current_span().set_attribute("prefix.break_cause", why.cause)  # a tag Jaeger searches by
        log.warning("parse.prefix_break", session_id=session, offset=offset, history_tokens=report.history_tokens,
                    prompt_tokens=report.prompt_tokens, in_output=report.in_output, cause=why.cause,
                    message_index=why.index, message_role=why.role, expected=report.expected, actual=report.actual)

    def _around(self, tokens: array[int], offset: int) -> str:
        before = self._decode(tokens[max(offset - 24, 0):offset].tolist())[-CONTEXT_CHARS // 2:]
        after = self._decode(tokens[offset:offset + 24].tolist())[:CONTEXT_CHARS // 2]
        return before + "⟂" + after

    def _commit(self, turn: Turn, message: ChatMessage | None) -> None:
        # by identity: the session's list may have been restored from another replica since ``begin``
        histories = [h for h in self._sessions.pop(turn.session, []) if h is not turn.line]
        histories.append(History(turn.prompt + array("I", turn.output), len(turn.prompt), turn.shape, message))
        self.restore(turn.session, histories)

    def histories(self, session: str) -> list[History] | None:
        """The session's lines, oldest first (None: none kept here)."""
        found = self._sessions.get(session)
        return None if found is None else list(found)

    def restore(self, session: str, histories: Sequence[History]) -> None:
        """Make ``histories`` the session's lines (the newest ``lines_per_session`` of them)."""
        self._sessions.pop(session, None)
        self._sessions[session] = list(histories)[-self._lines:]
        while len(self._sessions) > self._max_sessions:
            self._sessions.popitem(last=False)


def _salt(shape: TurnShape | None) -> str:
    return shape.cache_salt if shape is not None else ""


class _Identity(Protocol):
    session_id: str
    trajectory_id: str
    anonymous: bool


def session_key(identity: _Identity) -> str:
    """The watch's key: the session, and the trajectory inside it when it is not the session's main line."""
    if not identity.session_id or identity.anonymous:  # a made-up id has no earlier turn to compare with
        return ""
    if identity.trajectory_id and identity.trajectory_id != identity.session_id:
        return f"{identity.session_id}/{identity.trajectory_id}"
    return identity.session_id
