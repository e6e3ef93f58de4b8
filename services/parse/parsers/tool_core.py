"""What every tool-call parser shares: call ids, the JSON value scanner, the call/text event emitter."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from services.parse.parsers.events import Event, TextDelta, ToolCallArgumentsDelta, ToolCallDispatch, ToolCallStart

_SCALAR_END = frozenset(" \t\r\n},];")


def new_tool_call_id() -> str:
    """An OpenAI-style tool call id: ``call_`` + 24 hex digits."""
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True)
class ParserContext:
    """What a parser factory gets for one stream.

    ``prompt``: the rendered prompt (does generation start inside reasoning?). ``schemas``: tool name ->
    JSON Schema of its parameters (to type XML-style parameter values). ``marker``: maps a marker's text
    to what the decoded stream carries for it (a one-character sentinel when the tokenizer has the marker
    as a single special token, so it is matched by id and never by look-alike text).
    """

    prompt: str = ""
    new_call_id: Callable[[], str] = new_tool_call_id
    schemas: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    marker: Callable[[str], str] = str

    def param_type(self, tool: str, param: str) -> str:
        """The JSON Schema type of ``tool``'s parameter ``param`` ("" when unknown)."""
        props = self.schemas.get(tool, {}).get("properties", {})
        spec = props.get(param, {}) if isinstance(props, Mapping) else {}
        kind = spec.get("type", "") if isinstance(spec, Mapping) else ""
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "")
        return kind if isinstance(kind, str) else ""


class JsonScanner:
    """Finds where one JSON value ends, one character at a time (strings and nesting aware).

    ``depth`` > 0 starts the scanner inside that many open containers (to skip to an object's end).
    """

    def __init__(self, depth: int = 0) -> None:
        self.text = ""
        self.done = False
        self._depth = depth
        self._started = depth > 0
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

    def close(self) -> None:
        """End of input: a number / literal still being read is complete."""
        if self._scalar and self.text:
            self.done = True

    def push(self, c: str) -> bool:
        """Consume ``c``; False when ``c`` is not part of the value (it ended just before)."""
        if not self._started:
            if c.isspace():
                return True  # whitespace before the value is not part of it
            self._started = True
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


def valid_json(text: str) -> bool:
    try:
        json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return False
    return True


class CallEmitter:
    """Builds the events of one stream's tool calls and the text around them.

    Whitespace that only separates text from a call, or calls from each other, is the template's, not
    content: trailing whitespace of text is held back and dropped when a call follows (or when the
    stream ends after one). A plain text answer keeps its whitespace.
    """

    def __init__(self, new_call_id: Callable[[], str]) -> None:
        self._new_id = new_call_id
        self.index = -1
        self.id = ""
        self.name = ""
        self.arguments = ""
        self.open = False            # a call started and not yet dispatched or abandoned
        self._held_space = ""

    def text(self, text: str, events: list[Event]) -> None:
        combined = self._held_space + text
        body = combined.rstrip()
        self._held_space = combined[len(body):]
        if body:
            events.append(TextDelta(body))

    def end_text(self, events: list[Event]) -> None:
        """End of stream: held whitespace is content only when no call was made."""
        if self._held_space and self.index < 0:
            events.append(TextDelta(self._held_space))
        self._held_space = ""

    def start(self, name: str, events: list[Event], call_id: str = "") -> None:
        self._held_space = ""
        self.index += 1
        self.id = call_id or self._new_id()
        self.name = name
        self.arguments = ""
        self.open = True
        events.append(ToolCallStart(self.index, self.id, name))

    def args(self, delta: str, events: list[Event]) -> None:
        if delta:
            self.arguments += delta
            events.append(ToolCallArgumentsDelta(self.index, self.id, delta))

    def dispatch(self, events: list[Event]) -> bool:
        """Dispatch the open call if its arguments are valid JSON; False (call abandoned) otherwise."""
        self.open = False
        if not valid_json(self.arguments):
            return False
        events.append(ToolCallDispatch(self.index, self.id, self.name, self.arguments))
        return True

    def whole(self, name: str, arguments: Any, events: list[Event], call_id: str = "") -> None:
        """A call known all at once: start, one delta, dispatch."""
        self.start(name, events, call_id)
        self.args(arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False), events)
        self.dispatch(events)
