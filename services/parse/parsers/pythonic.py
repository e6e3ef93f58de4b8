"""Pythonic tool calls (Llama 3.2 / 4): ``[get_weather(city="Paris"), get_time(tz="CET")]``.

A list of calls opening the output, or following another list (optionally inside
``<|python_start|>`` .. ``<|python_end|>``) is parsed call by call: ``ToolCallStart`` once ``name(``
is read, and, the moment the call's ``)`` closes, its keyword arguments (Python literals) as one JSON
arguments delta and the dispatch. Output that does not open with such a list is text. Recovery: a
call whose arguments are not literals or that never closes is not dispatched; whatever follows a
broken list is dropped.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from enum import Enum

from services.parse.parsers.events import Event
from services.parse.parsers.tool_core import CallEmitter, ParserContext

_PYTHON_START = "<|python_start|>"
_CALL = re.compile(r"\s*([A-Za-z_][\w.]*)\s*\(")
_HALF_CALL = re.compile(r"\s*(?:[A-Za-z_][\w.]*\s*)?")
_PAIRS = {"(": ")", "[": "]", "{": "}"}


class _S(Enum):
    START = 0
    TEXT = 1
    CALL = 2
    ARGS = 3
    BETWEEN = 4


class PythonicToolParser:
    """Incremental parser of a pythonic call list; one instance per stream."""

    def __init__(self, ctx: ParserContext) -> None:
        self._calls = CallEmitter(ctx.new_call_id)
        self._s = _S.START
        self._buf = ""
        self._scan = 0
        self._stack: list[str] = []
        self._quote = ""

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
                head = self._buf.lstrip()
                if head.startswith(_PYTHON_START):
                    head = head[len(_PYTHON_START):].lstrip()
                elif not final and _PYTHON_START.startswith(head):
                    return events
                if head.startswith("[") and _CALL.match(head, 1):
                    self._buf, self._s = head[1:], _S.CALL
                elif not final and (not head or (head[0] == "[" and _HALF_CALL.fullmatch(head, 1))):
                    return events
                else:
                    self._s = _S.TEXT
            elif self._s is _S.TEXT:
                self._calls.text(self._buf.replace("<|python_end|>", ""), events)
                self._buf = ""
                return events
            elif self._s is _S.CALL:
                match = _CALL.match(self._buf)
                if match is None:
                    if final or not _HALF_CALL.fullmatch(self._buf):
                        self._buf, self._s = "", _S.TEXT
                        continue
                    return events
                self._calls.start(match.group(1), events)
                self._buf = self._buf[match.end():]
                self._s, self._scan, self._stack, self._quote = _S.ARGS, 0, ["("], ""
            elif self._s is _S.ARGS:
                if not self._close_args():
                    if final:
                        self._calls.open = False
                        self._buf = ""
                    return events
                body, self._buf = self._buf[: self._scan - 1], self._buf[self._scan:]
                arguments = _kwargs_json(body)
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
                    self._s = _S.CALL
                elif rest[0] == "]":  # the list ended: another may follow at once, else text
                    self._buf = rest[1:].lstrip().removeprefix("<|python_end|>")
                    self._s = _S.START
                else:
                    self._buf, self._s = "", _S.TEXT

    def _close_args(self) -> bool:
        """Advance the scan over the argument text; True once the call's ``)`` was read."""
        buf = self._buf
        while self._scan < len(buf):
            c = buf[self._scan]
            self._scan += 1
            if self._quote:
                if c == "\\":
                    self._scan += 1
                elif c == self._quote:
                    self._quote = ""
            elif c in "\"'":
                self._quote = c
            elif c in _PAIRS:
                self._stack.append(c)
            elif c in ")]}":
                self._stack.pop()
                if not self._stack:
                    return True
        return False


def _kwargs_json(body: str) -> str | None:
    """``a=1, b="x"`` -> ``{"a": 1, "b": "x"}``; None when it is not keyword literals."""
    try:
        call = ast.parse(f"f({body})", mode="eval").body
        if not isinstance(call, ast.Call) or call.args:
            return None
        values = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg is not None}
        return json.dumps(values, ensure_ascii=False)
    except (SyntaxError, ValueError, TypeError):
        return None
