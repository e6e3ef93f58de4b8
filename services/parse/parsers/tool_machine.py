"""One incremental state machine for every marker/JSON/XML tool-call format in ``tool_formats``.

Streaming: ``ToolCallStart`` as soon as the name is known, the arguments JSON as deltas while it
arrives, ``ToolCallDispatch`` the moment the arguments are complete and valid JSON — for JSON
arguments when the value closes (before the object's ``}`` or any end marker, so formats without an
end marker dispatch too), for XML-style parameters at the call's end marker.

Recovery (end of stream or malformed input); markers never reach the visible text:
- a call whose arguments completed was dispatched; whatever follows it inside the section is dropped;
- a call whose name is known but whose arguments never completed (output truncated at max_tokens) or
  are not valid JSON keeps the start / delta events already sent and is never dispatched;
- a JSON object that opened a call but never yields a name is emitted as text (without the markers);
- an unfinished header (half a function name) is dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from enum import Enum

from services.parse.parsers.base import find_first, partial_marker_len
from services.parse.parsers.events import Event
from services.parse.parsers.tool_core import CallEmitter, JsonScanner, ParserContext
from services.parse.parsers.tool_formats import ToolFormat
from services.parse.parsers.tool_params import ParamsBody

_OBJECT_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:')
_NAME = re.compile(r"\s*([^\s\[<>\"\U000F0000-\U000FFFFF]+)")
_INDEX_SUFFIX = re.compile(r":\d+$")


class _S(Enum):
    TEXT = 0
    SECTION = 1
    OBJECT = 2      # inside a {"name": .., "arguments": ..} object, before the arguments
    HEADER = 3
    ARGS = 4        # a JSON arguments value
    PARAMS = 5
    TAIL = 6        # after the arguments: skip to the call's end


class MarkedToolParser:
    """Incremental parser of one ``ToolFormat``; one instance per stream."""

    def __init__(self, fmt: ToolFormat, ctx: ParserContext) -> None:
        self._f = fmt.remap(ctx.marker)
        self._ctx = ctx
        self._calls = CallEmitter(ctx.new_call_id)
        self._s = _S.TEXT
        self._buf = ""
        self._section_end = ""
        self._calls_in_section = 0
        self._array = False
        self._seen_text = False       # bare_start only applies at the very beginning of the output
        self._scanner = JsonScanner()
        self._sent = 0
        self._params: ParamsBody | None = None
        self._object_call = False
        self._starts = tuple(start for start, _ in self._f.sections)
        self._keep = {m for m in (self._f.call_end, *(e for _, e in self._f.sections)) if m}
        if self._f.params:
            self._keep.add(self._f.params.open)

    @property
    def dispatched(self) -> int:
        return self._calls.index + 1

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Event]:
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[Event]:
        events = self._drain(final=True)
        if self._s is _S.OBJECT and self._buf.strip():
            self._calls.text(self._strip_markers(self._buf), events)  # a JSON object that never named a call is text
        self._buf = ""
        self._calls.end_text(events)
        return events

    def _drain(self, *, final: bool) -> list[Event]:
        events: list[Event] = []
        step = {
            _S.TEXT: self._text, _S.SECTION: self._section, _S.OBJECT: self._object, _S.HEADER: self._header,
            _S.ARGS: self._args, _S.PARAMS: self._param_body, _S.TAIL: self._tail,
        }
        while step[self._s](events, final):
            pass
        return events

    def _open_section(self, end: str) -> None:
        self._s, self._section_end, self._calls_in_section, self._array = _S.SECTION, end, 0, False

    # -- states: each returns True when it changed state and draining should go on --------------------

    def _text(self, events: list[Event], final: bool) -> bool:
        f = self._f
        if f.bare_start and not self._seen_text:
            stripped = self._buf.lstrip()
            if stripped[:1] in ("{", "["):
                self._buf = stripped
                self._open_section("")
                return True
            if not stripped and not final:
                return False
        at, start = find_first(self._buf, self._starts)
        if at >= 0:
            self._calls.text(self._buf[:at], events)
            self._seen_text = True
            self._buf = self._buf[at + len(start):]
            self._open_section(dict(f.sections)[start])
            return True
        hold = 0 if final else partial_marker_len(self._buf, *self._starts)
        emit, self._buf = self._buf[: len(self._buf) - hold], self._buf[len(self._buf) - hold:]
        self._seen_text = self._seen_text or bool(emit.strip())
        self._calls.text(emit, events)
        return False

    def _section(self, events: list[Event], final: bool) -> bool:
        f = self._f
        buf = self._buf.lstrip()
        while buf and buf[0] in f.separators and self._calls_in_section:
            buf = buf[1:].lstrip()
        self._buf = buf
        if not buf:
            if final:
                self._s = _S.TEXT
            return False
        end = self._section_end
        candidates = [m for m in (end, *self._starts, f.call_start) if m]
        for marker in candidates:
            if buf.startswith(marker):
                self._buf = buf[len(marker):]
                if marker == end:
                    self._s = _S.TEXT
                elif marker == f.call_start:
                    self._s = _S.HEADER
                else:
                    self._open_section(dict(f.sections)[marker])
                return True
        if not final and any(m.startswith(buf) for m in candidates):
            return False
        if buf[0] == "]" and self._array:
            self._buf, self._array = buf[1:], False
            if not end:
                self._s = _S.TEXT
            return True
        if buf[0] == "[" and not self._array and not self._calls_in_section:
            self._buf, self._array = buf[1:], True
            return True
        if buf[0] == "{":
            self._s, self._scanner, self._sent = _S.OBJECT, JsonScanner(), 0
            return True
        if f.header_ends and not f.call_start and not self._calls_in_section:
            self._s = _S.HEADER
            return True
        if end:  # text inside a section that is not a call: visible, without the section's markers
            at = buf.find(end)
            if at < 0 and not final:
                return False
            self._calls.text(self._strip_markers(buf if at < 0 else buf[:at]), events)
            self._buf = "" if at < 0 else buf[at + len(end):]
            self._s = _S.TEXT
            return True
        self._s = _S.TEXT  # not a call: the section is over; what follows is text
        return True

    def _object(self, events: list[Event], final: bool) -> bool:
        match = _OBJECT_HEADER.match(self._buf)
        if match is not None:
            try:
                name = json.loads('"' + match.group(1) + '"')
            except json.JSONDecodeError:
                name = None
            if isinstance(name, str):
                self._calls.start(name, events)
                self._buf = self._buf[match.end():]
                self._object_call = True
                self._calls_in_section += 1
                self._begin_args()
                return True
        scanner = JsonScanner()
        for c in self._buf:
            if not scanner.push(c) or scanner.done:
                break
        if not scanner.done:
            return False
        body = scanner.text
        self._buf = self._buf[self._buf.index("{") + len(body):]
        self._whole_object(body, events)
        self._calls_in_section += 1
        self._s = _S.SECTION
        return True

    def _whole_object(self, body: str, events: list[Event]) -> None:
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            self._calls.whole(obj["name"], obj.get("arguments", obj.get("parameters", {})), events)
        else:
            self._calls.text(body, events)

    def _header(self, events: list[Event], final: bool) -> bool:
        f = self._f
        at, end = find_first(self._buf, f.header_ends)
        if at < 0:
            if final:
                self._buf, self._s = "", _S.TEXT  # half a header carries nothing worth showing
            return False
        header = self._buf[:at]
        self._buf = self._buf[at + (0 if end in self._keep else len(end)):]
        if f.name_after and f.name_after in header:
            header = header.split(f.name_after)[-1]
        match = _NAME.match(header)
        if match is None:
            self._s = _S.SECTION
            self._calls_in_section += 1
            return True
        raw = match.group(1)
        name = _INDEX_SUFFIX.sub("", raw.removeprefix(f.name_prefix))
        self._calls.start(name, events, raw if f.id_from_header else "")
        self._object_call = False
        self._calls_in_section += 1
        if f.params is not None:
            self._params = ParamsBody(f.params, name, self._ctx)
            self._s = _S.PARAMS
        else:
            self._buf = self._buf.lstrip().removeprefix(f.args_prefix)
            self._begin_args()
        return True

    def _begin_args(self) -> None:
        self._scanner, self._sent, self._s = JsonScanner(), 0, _S.ARGS

    def _stops(self) -> tuple[str, ...]:
        return tuple(m for m in (self._f.call_end, self._section_end) if m)

    def _args(self, events: list[Event], final: bool) -> bool:
        scanner, buf, stops, i = self._scanner, self._buf, self._stops(), 0
        broken = False
        while i < len(buf):
            if not scanner.in_string and stops:
                rest = buf[i:i + 64]
                if any(rest.startswith(m) for m in stops):
                    broken = True  # the call closed before its arguments did: never dispatched
                    break
                if not final and any(m.startswith(rest) for m in stops):
                    break  # maybe an end marker: wait for more
            if not scanner.push(buf[i]):
                break
            i += 1
            if scanner.done:
                break
        if final and not broken and i == len(buf):
            scanner.close()
        self._buf = buf[i:]
        if scanner.text[self._sent:] and (scanner.done or not scanner.is_scalar):
            self._calls.args(scanner.text[self._sent:], events)
            self._sent = len(scanner.text)
        if scanner.done:
            self._calls.dispatch(events)
        elif broken:
            self._calls.open = False
        else:
            return False
        if self._f.call_end or self._object_call:
            self._s, self._scanner = _S.TAIL, JsonScanner(depth=1)
        else:
            self._s = _S.SECTION
        return True

    def _param_body(self, events: list[Event], final: bool) -> bool:
        assert self._params is not None
        end = self._f.call_end or self._section_end
        self._buf, closed = self._params.feed(self._buf, end, events, self._calls, final=final)
        if closed:
            self._calls.dispatch(events)
            self._s = _S.SECTION if self._f.call_end else _S.TEXT
        return closed

    def _tail(self, events: list[Event], final: bool) -> bool:
        buf, end = self._buf, self._section_end
        if self._object_call:  # skip to the end of the object that held the arguments
            scanner, i = self._scanner, 0
            while i < len(buf) and not scanner.done:
                if not scanner.in_string and end and buf.startswith(end, i):
                    break
                scanner.push(buf[i])
                i += 1
            self._buf = buf[i:]
            if scanner.done or i < len(buf):
                self._s = _S.SECTION
                return True
            return False
        stops = self._stops()
        at, marker = find_first(buf, stops)
        if at >= 0:
            self._buf = buf[at + (len(marker) if marker == self._f.call_end else 0):]
            self._s = _S.SECTION
            return True
        self._buf = "" if final else buf[len(buf) - partial_marker_len(buf, *stops):]
        return False

    def _strip_markers(self, text: str) -> str:
        for marker in self._f.markers:
            text = text.replace(marker, "")
        return text
