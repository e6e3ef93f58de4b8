"""What every tool-call parser shares: call ids, the parser context, the call/text event emitter."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from services.parse.parsers.events import Event, TextDelta, ToolCallArgumentsDelta, ToolCallDispatch, ToolCallStart


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
    stream ends after one). A plain text answer keeps its whitespace. Held whitespace and a call's
    arguments are kept as pieces (joined once), so a long run of either costs linear time.
    """

    def __init__(self, new_call_id: Callable[[], str]) -> None:
        self._new_id = new_call_id
        self.index = -1
        self.id = ""
        self.name = ""
        self._arguments: list[str] = []
        self.open = False            # a call started and not yet dispatched or abandoned
        self._held_space: list[str] = []

    @property
    def arguments(self) -> str:
        """The open (or last) call's arguments text so far."""
        if len(self._arguments) > 1:
            self._arguments = ["".join(self._arguments)]
        return self._arguments[0] if self._arguments else ""

    def text(self, text: str, events: list[Event]) -> None:
        body = text.rstrip()
        if not body:
            if text:
                self._held_space.append(text)
            return
        events.append(TextDelta("".join(self._held_space) + body if self._held_space else body))
        self._held_space = [text[len(body):]] if len(body) < len(text) else []

    def end_text(self, events: list[Event]) -> None:
        """End of stream: held whitespace is content only when no call was made."""
        if self._held_space and self.index < 0:
            events.append(TextDelta("".join(self._held_space)))
        self._held_space = []

    def start(self, name: str, events: list[Event], call_id: str = "") -> None:
        self._held_space = []
        self.index += 1
        self.id = call_id or self._new_id()
        self.name = name
        self._arguments = []
        self.open = True
        events.append(ToolCallStart(self.index, self.id, name))

    def args(self, delta: str, events: list[Event]) -> None:
        if delta:
            self._arguments.append(delta)
            events.append(ToolCallArgumentsDelta(self.index, self.id, delta))

    def dispatch(self, events: list[Event]) -> bool:
        """Dispatch the open call if its arguments are valid JSON; False (call abandoned) otherwise."""
        self.open = False
        arguments = self.arguments
        if not valid_json(arguments):
            return False
        events.append(ToolCallDispatch(self.index, self.id, self.name, arguments))
        return True

    def whole(self, name: str, arguments: Any, events: list[Event], call_id: str = "") -> None:
        """A call known all at once: start, one delta, dispatch."""
        self.start(name, events, call_id)
        self.args(arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False), events)
        self.dispatch(events)
