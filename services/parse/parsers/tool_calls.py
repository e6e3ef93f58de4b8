"""Tool calls written as JSON between markers (Hermes / Qwen: ``<tool_call>{"name": .., "arguments": ..}</tool_call>``).

Streaming: ``ToolCallStart`` as soon as the name is known, the raw arguments JSON as deltas while it
arrives, and ``ToolCallDispatch`` the moment the arguments value is complete (before the closing
``}`` and end marker). The deltas concatenate to exactly ``ToolCallDispatch.arguments_json``.
A body whose header does not stream-parse is judged whole at the end marker: a JSON object with a
name becomes a call, anything else is emitted back as text. Nothing raises.

Whitespace that only separates text from a call, or calls from each other, is not content: it is held
back and dropped when a call follows (or the stream ends after one), the way chat templates (Qwen3's,
the demo model's) re-insert their own separator on replay. A plain text answer keeps its whitespace.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from services.parse.parsers.base import partial_marker_len
from services.parse.parsers.events import (
    Event,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallDispatch,
    ToolCallStart,
)


def new_tool_call_id() -> str:
    """An OpenAI-style tool call id: ``call_`` + 24 hex digits."""
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True)
class ToolCallFormat:
    """A model family's tool-call markers, as data."""

    start: str
    end: str


HERMES = ToolCallFormat(start="<tool_call>", end="</tool_call>")

_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:')
_SCALAR_END = frozenset(" \t\r\n},]")


class _State(Enum):
    TEXT = "text"
    HEADER = "header"      # after the start marker, waiting for name and "arguments":
    ARGS = "args"          # streaming the arguments value
    TAIL = "tail"          # arguments done, skipping to the end marker


class _ArgsScanner:
    """Finds where one JSON value ends, one character at a time (strings and nesting aware)."""

    def __init__(self) -> None:
        self.text = ""
        self.done = False
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._scalar = False

    @property
    def in_string(self) -> bool:
        return self._in_string

    @property
    def is_scalar(self) -> bool:
        """A number / true / false / null: its end is only known at the next character, so it is not streamed."""
        return self._scalar

    def push(self, c: str) -> bool:
        """Consume ``c``; False when ``c`` is not part of the value (it ended just before)."""
        if not self.text:
            if c.isspace():
                return True  # whitespace before the value is not part of arguments_json
            self.text = c
            if c in "{[":
                self._depth = 1
            elif c == '"':
                self._in_string = True
            else:
                self._scalar = True
            return True
        if self._scalar:
            if c in _SCALAR_END:
                self.done = True
                return False
            self.text += c
            return True
        self.text += c
        if self._in_string:
            if self._escape:
                self._escape = False
            elif c == "\\":
                self._escape = True
            elif c == '"':
                self._in_string = False
                self.done = self._depth == 0
        elif c == '"':
            self._in_string = True
        elif c in "{[":
            self._depth += 1
        elif c in "}]":
            self._depth -= 1
            self.done = self._depth == 0
        return True


class JsonToolCallParser:
    """Incremental parser of JSON tool calls between markers; one instance per stream."""

    def __init__(self, fmt: ToolCallFormat, new_call_id: Callable[[], str] = new_tool_call_id) -> None:
        self._fmt = fmt
        self._new_id = new_call_id
        self._state = _State.TEXT
        self._buf = ""
        self._index = -1
        self._id = ""
        self._name = ""
        self._scanner = _ArgsScanner()
        self._emitted = 0          # chars of the scanner's text already sent as deltas
        self._held_space = ""      # trailing whitespace of the text so far, not yet known to be content
        self._space_before_call = ""
        self.dispatched = 0

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Event]:
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[Event]:
        return self._drain(final=True)

    def _drain(self, *, final: bool) -> list[Event]:
        events: list[Event] = []
        fmt = self._fmt
        while True:
            if self._state is _State.TEXT:
                at = self._buf.find(fmt.start)
                if at >= 0:
                    self._emit_text(self._buf[:at], events)
                    # A separator before a call is the template's, not content -- unless the call turns out broken.
                    self._space_before_call, self._held_space = self._held_space, ""
                    self._buf = self._buf[at + len(fmt.start):]
                    self._state = _State.HEADER
                    continue
                hold = 0 if final else partial_marker_len(self._buf, fmt.start)
                emit, self._buf = self._buf[: len(self._buf) - hold], self._buf[len(self._buf) - hold:]
                self._emit_text(emit, events)
                if final and self._held_space and self._index < 0:
                    events.append(TextDelta(self._held_space))
                if final:
                    self._held_space = ""
                return events
            if self._state is _State.HEADER:
                end = self._buf.find(fmt.end)
                match = _HEADER.match(self._buf)
                if match and (end < 0 or match.end() <= end) and self._start_call(match.group(1), events):
                    self._buf = self._buf[match.end():]
                    self._state = _State.ARGS
                    continue
                if end >= 0:
                    events.extend(self._whole_call(self._buf[:end]))
                    self._buf = self._buf[end + len(fmt.end):]
                    self._state = _State.TEXT
                    continue
                if final:
                    events.append(TextDelta(self._space_before_call + fmt.start + self._buf))
                    self._buf = ""
                return events
            if self._state is _State.ARGS:
                if not self._scan_args(events, final=final):
                    return events
                continue
            # TAIL: skip the outer object's closing up to the end marker.
            end = self._buf.find(fmt.end)
            if end < 0:
                if final:
                    self._buf = ""
                return events
            self._buf = self._buf[end + len(fmt.end):]
            self._state = _State.TEXT

    def _emit_text(self, text: str, events: list[Event]) -> None:
        """Emit text, holding back its trailing whitespace until something other than a call follows."""
        combined = self._held_space + text
        body = combined.rstrip()
        self._held_space = combined[len(body):]
        if body:
            events.append(TextDelta(body))

    def _start_call(self, raw_name: str, events: list[Event]) -> bool:
        try:
            name = json.loads('"' + raw_name + '"')
        except json.JSONDecodeError:
            return False
        self._index += 1
        self._id = self._new_id()
        self._name = name
        self._scanner = _ArgsScanner()
        self._emitted = 0
        events.append(ToolCallStart(self._index, self._id, name))
        return True

    def _scan_args(self, events: list[Event], *, final: bool) -> bool:
        """Advance through the arguments; True when the state changed and draining should continue."""
        scanner = self._scanner
        end_marker = self._fmt.end
        consumed = 0
        changed = False
        while consumed < len(self._buf):
            c = self._buf[consumed]
            if c == end_marker[0] and not scanner.in_string:
                rest = self._buf[consumed:]
                if rest.startswith(end_marker):
                    # The call closed before its arguments did: a broken call, never dispatched.
                    self._state = _State.TAIL
                    changed = True
                    break
                if end_marker.startswith(rest) and not final:
                    break  # maybe the end marker: wait for more
            if not scanner.push(c):
                break
            consumed += 1
            if scanner.done:
                break
        self._buf = self._buf[consumed:]
        changed = changed or scanner.done
        delta = scanner.text[self._emitted:]
        if delta and (scanner.done or not scanner.is_scalar):
            events.append(ToolCallArgumentsDelta(self._index, self._id, delta))
            self._emitted = len(scanner.text)
        if scanner.done:
            events.append(ToolCallDispatch(self._index, self._id, self._name, scanner.text))
            self.dispatched += 1
            self._state = _State.TAIL
        return changed

    def _whole_call(self, body: str) -> list[Event]:
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            obj = None
        if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)):
            return [TextDelta(self._space_before_call + self._fmt.start + body + self._fmt.end)]
        arguments = obj.get("arguments", obj.get("parameters", {}))
        args_json = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        events: list[Event] = []
        self._start_call(json.dumps(obj["name"], ensure_ascii=False)[1:-1], events)
        events.append(ToolCallArgumentsDelta(self._index, self._id, args_json))
        events.append(ToolCallDispatch(self._index, self._id, self._name, args_json))
        self.dispatched += 1
        return events


def hermes_tool_parser(new_call_id: Callable[[], str] = new_tool_call_id) -> JsonToolCallParser:
    """Hermes / Qwen ``<tool_call>`` JSON tool calls."""
    return JsonToolCallParser(HERMES, new_call_id)
