"""XML-style parameters (Qwen3-Coder, GLM 4.5/4.7, MiniMax M2, DeepSeek DSML) -> streamed JSON arguments.

String values (by the tool's schema, or ``string="true"``) stream as JSON string deltas while they
arrive; other values are parsed as JSON at their end marker (falling back to a string). The deltas
concatenate to ``json.dumps(arguments, ensure_ascii=False)``. A key or a non-string value that is
long in coming is held as pieces (linear in its length), never re-searched on each feed.
"""

from __future__ import annotations

import json
import re
from enum import Enum

from services.parse.parsers.base import HeldText, partial_marker_len, run_end
from services.parse.parsers.events import Event
from services.parse.parsers.tool_core import CallEmitter, ParserContext
from services.parse.parsers.tool_formats import ParamsFormat

_SPACE = re.compile(r"\s*")
_GAP = 16  # whitespace a template writes between a value's end and the next parameter (a newline or two)


class _P(Enum):
    BETWEEN = 0
    KEY = 1
    VALUE_START = 2
    VALUE = 3


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


class ParamsBody:
    """The parameters of one call, fed the text after its header until ``end`` closes the call."""

    def __init__(self, fmt: ParamsFormat, tool: str, ctx: ParserContext) -> None:
        self._f = fmt
        self._tool = tool
        self._ctx = ctx
        self._state = _P.BETWEEN
        self._count = 0
        self._string = True
        self._key_text = HeldText()
        self._value: list[str] = []
        self._fresh = True              # no value character seen yet (the leading trim is still possible)
        self._after: tuple[str, ...] = ()  # what may follow a value's real end: the next parameter, the call's end

    def feed(self, buf: str, end: str, events: list[Event], calls: CallEmitter, *, final: bool) -> tuple[str, bool]:
        """Consume what it can of ``buf``; returns the rest and whether ``end`` closed the call."""
        f = self._f
        self._after = (f.open, end)
        while True:
            if self._state is _P.BETWEEN:
                buf = buf.lstrip()
                if buf.startswith(end):
                    calls.args("}" if self._count else "{}", events)
                    return buf[len(end):], True
                if buf.startswith(f.open):
                    buf, self._state, self._key_text = buf[len(f.open):], _P.KEY, HeldText((f.key_end,))
                    continue
                if not buf or (not final and (end.startswith(buf) or f.open.startswith(buf))):
                    return ("" if final else buf), False
                at = min((i for i in (buf.find(end), buf.find(f.open)) if i >= 0), default=-1)
                if at < 0:
                    return ("" if final else buf[len(buf) - partial_marker_len(buf, end, f.open):]), False
                buf = buf[at:]  # stray text between parameters is not an argument
                continue
            if self._state is _P.KEY:
                at, _ = self._key_text.add(buf)
                if at < 0:
                    return "", False
                held = self._key_text.text()
                self._key(held[:at], events, calls)
                buf = held[at + len(f.key_end):]
                continue
            if self._state is _P.VALUE_START:
                stripped = buf.lstrip()
                if not final and f.value_start.startswith(stripped):
                    return stripped, False  # the whitespace before the value's opener is dropped anyway
                buf, self._state = stripped.removeprefix(f.value_start), _P.VALUE
                continue
            buf, closed = self._value_piece(buf, events, calls, final=final)
            if not closed:
                return buf, False

    def _key(self, header: str, events: list[Event], calls: CallEmitter) -> None:
        key = header.split('"')[0].strip()
        if 'string="false"' in header:
            self._string = False
        elif 'string="true"' in header:
            self._string = True
        else:
            self._string = self._ctx.param_type(self._tool, key) in ("string", "")
        head = ("{" if not self._count else ", ") + _dumps(key) + ": " + ('"' if self._string else "")
        calls.args(head, events)
        self._value, self._fresh = [], True
        self._state = _P.VALUE_START if self._f.value_start else _P.VALUE

    def _value_end(self, buf: str, *, final: bool) -> tuple[int, bool]:
        """(where the value's real end marker is, True), or (where undecided text begins, False).

        A ``value_end`` is the value's end only when the grammar's next step follows it (whitespace, then
        the next parameter or the call's end); otherwise it is part of the value. One that is followed by
        too little to tell is held (with at most ``_GAP`` characters of whitespace after it).
        """
        end_marker = self._f.value_end
        start = 0
        while True:
            at = buf.find(end_marker, start)
            if at < 0:
                return len(buf) - (0 if final else partial_marker_len(buf, end_marker)), False
            after = at + len(end_marker)
            gap = run_end(_SPACE, buf[after:after + _GAP + 1])
            rest = buf[after + gap: after + gap + 64]
            if any(rest.startswith(m) for m in self._after if m):
                return at, True
            if any(m.startswith(rest) for m in self._after if m):
                if not final:
                    return at, False    # undecided: hold from the end marker on
                return at, True         # the stream ended right after it
            start = at + 1

    def _value_piece(self, buf: str, events: list[Event], calls: CallEmitter, *, final: bool) -> tuple[str, bool]:
        f = self._f
        at, closed = self._value_end(buf, final=final)
        if closed:
            piece, rest = buf[:at], buf[at + len(f.value_end):]
        else:
            piece, rest = buf[:at], buf[at:]
            if f.trim and piece.endswith(f.trim) and not final:
                piece, rest = piece[: -len(f.trim)], f.trim + rest
        if self._fresh and f.trim:
            if not piece and not closed and not final:
                return rest, False
            piece = piece.removeprefix(f.trim)
        self._fresh = self._fresh and not piece
        if closed and f.trim:
            piece = piece.removesuffix(f.trim)
        if self._string:
            if piece:
                calls.args(_dumps(piece)[1:-1], events)
        elif piece:
            self._value.append(piece)
        if not closed:
            return rest, False
        if self._string:
            calls.args('"', events)
        else:
            calls.args(_dumps(_json_or_text("".join(self._value).strip())), events)
        self._count += 1
        self._state = _P.BETWEEN
        return rest, True


def _json_or_text(text: str) -> object:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return text
