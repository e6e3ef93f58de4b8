"""Pythonic tool calls (Llama 3.2 / 4): ``[get_weather(city="Paris"), get_time(tz="CET")]``.

A list of calls opening the output, or following another list (optionally inside
``<|python_start|>`` .. ``<|python_end|>``) is parsed call by call: ``ToolCallStart`` once ``name(``
is read, and, the moment the call's ``)`` closes, its keyword arguments (Python literals) as one JSON
arguments delta and the dispatch. Output that does not open with such a list is text. Recovery: a
call whose arguments are not literals or that never closes is not dispatched; whatever follows a
broken list is dropped.

Linear in the input: the list's opening, each ``name(`` and each call's arguments are read as they
arrive and never re-read; text that may still turn out to be a call is held as pieces.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from enum import Enum

from services.parse.parsers.base import run_end
from services.parse.parsers.events import Event
from services.parse.parsers.tool_core import CallEmitter, ParserContext

_PYTHON_START = "<|python_start|>"
_SPACE = re.compile(r"\s*")
_NAME_START = re.compile(r"[A-Za-z_]")
_NAME = re.compile(r"[\w.]*")
_PLAIN = re.compile(r"[^\"'()\[\]{}]*")
_QUOTED = {q: re.compile(rf"[^\\{q}]*(?:\\.[^\\{q}]*)*", re.S) for q in "\"'"}
_OPENERS = re.compile(r"[(\[{]+")


class _S(Enum):
    START = 0
    TEXT = 1
    CALL = 2
    ARGS = 3
    BETWEEN = 4


class _CallHead:
    """``name(`` (``\\s*[A-Za-z_][\\w.]*\\s*\\(``) read as it arrives: whitespace, a name, whitespace, ``(``."""

    def __init__(self) -> None:
        self._phase = 0
        self._name: list[str] = []

    @property
    def name(self) -> str:
        return "".join(self._name)

    def feed(self, buf: str) -> tuple[bool | None, int]:
        """(True, end) once ``(`` was read; (False, at) when ``buf`` cannot go on a call; (None, len) until then."""
        n = len(buf)
        i = 0
        if self._phase == 0:
            i = run_end(_SPACE, buf)
            if i == n:
                return None, n
            if not _NAME_START.match(buf, i):
                return False, i
            self._phase = 1
        if self._phase == 1:
            end = run_end(_NAME, buf, i)
            self._name.append(buf[i:end])
            if end == n:
                return None, n
            self._phase, i = 2, end
        i = run_end(_SPACE, buf, i)
        if i == n:
            return None, n
        return buf[i] == "(", i + 1


class PythonicToolParser:
    """Incremental parser of a pythonic call list; one instance per stream."""

    def __init__(self, ctx: ParserContext) -> None:
        self._calls = CallEmitter(ctx.new_call_id)
        self._s = _S.START
        self._buf = ""
        self._start: list[str] = []     # text read in START: it is the answer's text if no call list opens
        self._opened = 0                # START: 0 before, 1 after <|python_start|>, 2 after "["
        self._head = _CallHead()
        self._body: list[str] = []      # the open call's arguments read so far
        self._depth = 0
        self._quote = ""
        self._escaped = False           # the next character is escaped (a backslash ended the last feed)
        self._after_list = False        # START right after a list's "]"

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Event]:
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[Event]:
        events = self._drain(final=True)
        self._calls.end_text(events)
        return events

    def _drain(self, *, final: bool) -> list[Event]:
        events: list[Event] = []
        while True:
            if self._s is _S.START:
                if not self._list_start(events, final):
                    return events
            elif self._s is _S.TEXT:
                self._calls.text(self._buf.replace("<|python_end|>", ""), events)
                self._buf = ""
                return events
            elif self._s is _S.CALL:
                opened, end = self._head.feed(self._buf)
                if opened is None and not final:
                    self._buf = ""
                    return events
                if not opened:
                    self._buf, self._s = "", _S.TEXT
                    continue
                self._begin_args(self._buf[end:], events)
            elif self._s is _S.ARGS:
                if not self._close_args():
                    if final:
                        self._calls.open = False
                        self._buf = ""
                    return events
                arguments = _kwargs_json("".join(self._body))
                if arguments is None:
                    self._calls.open = False
                else:
                    self._calls.args(arguments, events)
                    self._calls.dispatch(events)
                self._s = _S.BETWEEN
            else:
                rest = self._buf.lstrip()
                if not rest:
                    self._buf = ""
                    return events
                self._buf = rest[1:]
                if rest[0] == ",":
                    self._s, self._head = _S.CALL, _CallHead()
                elif rest[0] == "]":  # the list ended: another may follow at once, else text
                    self._buf = rest[1:].lstrip().removeprefix("<|python_end|>")
                    self._s, self._start, self._opened, self._head = _S.START, [], 0, _CallHead()
                    self._after_list = True
                else:
                    self._buf, self._s = "", _S.TEXT

    def _list_start(self, events: list[Event], final: bool) -> bool:
        """START: ``[<|python_start|>] [ name(`` opens a call list; True when decided (state changed)."""
        buf = self._buf
        while self._opened < 2:
            i = run_end(_SPACE, buf)
            if not self._after_list:  # whitespace after a list separates it from what follows: not text
                self._start.append(buf[:i])
            buf = buf[i:]
            if not self._opened and buf.startswith(_PYTHON_START):
                self._start.append(_PYTHON_START)
                buf, self._opened = buf[len(_PYTHON_START):], 1
                continue
            if not buf or (not self._opened and _PYTHON_START.startswith(buf)):
                if final:
                    break
                self._buf = buf
                return False
            self._after_list = False
            if buf[0] != "[":
                break
            self._start.append("[")
            buf, self._opened = buf[1:], 2
        if self._opened == 2:
            opened, end = self._head.feed(buf)
            if opened:
                self._begin_args(buf[end:], events)
                self._start = []
                return True
            self._start.append(buf)
            buf = ""
            if opened is None and not final:
                self._buf = ""
                return False
        self._buf, self._s = "".join(self._start) + buf, _S.TEXT
        self._start = []
        return True

    def _begin_args(self, rest: str, events: list[Event]) -> None:
        self._calls.start(self._head.name, events)
        self._buf, self._s = rest, _S.ARGS
        self._body, self._depth, self._quote, self._escaped = [], 1, "", False

    def _close_args(self) -> bool:
        """Read the new argument text; True once the call's ``)`` was read (the rest stays in the buffer)."""
        buf, i, n = self._buf, 0, len(self._buf)
        while i < n:
            if self._escaped:
                self._escaped, i = False, i + 1
            elif self._quote:
                i = run_end(_QUOTED[self._quote], buf, i)
                if i == n:
                    break
                if buf[i] == "\\":  # a backslash ends the input: the character it escapes comes next
                    self._escaped = True
                else:
                    self._quote = ""
                i += 1
            else:
                i = run_end(_PLAIN, buf, i)
                if i == n:
                    break
                c = buf[i]
                if c in "\"'":
                    self._quote, i = c, i + 1
                elif c in "([{":
                    end = run_end(_OPENERS, buf, i)
                    self._depth, i = self._depth + end - i, end
                else:
                    self._depth, i = self._depth - 1, i + 1
                    if not self._depth:
                        self._body.append(buf[: i - 1])
                        self._buf = buf[i:]
                        return True
        self._body.append(buf)
        self._buf = ""
        return False


def _kwargs_json(body: str) -> str | None:
    """``a=1, b="x"`` -> ``{"a": 1, "b": "x"}``; None when it is not keyword literals."""
    try:
        call = ast.parse(f"f({body})", mode="eval").body
        if not isinstance(call, ast.Call) or call.args:
            return None
        values = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg is not None}
        return json.dumps(values, ensure_ascii=False)
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None
