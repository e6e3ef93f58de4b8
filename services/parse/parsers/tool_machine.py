"""One incremental state machine for every marker/JSON/XML tool-call format in ``tool_formats``.

Streaming: ``ToolCallStart`` as soon as the name is known, the arguments JSON as deltas while it
arrives, ``ToolCallDispatch`` the moment the arguments are complete and valid JSON — for JSON
arguments when the value closes (before the object's ``}`` or any end marker, so formats without an
end marker dispatch too), for XML-style parameters at the call's end marker.

A start marker opens a section only when the format's call header follows it (``tool_header.py``:
``{"name"``, ``<function=``, a name and ``[ARGS]``, ...); otherwise the marker is text, released as
soon as that is decided (a model quoting its own syntax in prose). Text after a section's calls that
is no call ends the section and is text, markers included.

Recovery (end of stream or malformed input):
- a call whose arguments completed was dispatched; whatever follows it inside the section is dropped;
- a call whose name is known but whose arguments never completed (output truncated at max_tokens) or
  are not valid JSON keeps the start / delta events already sent and is never dispatched;
- a JSON object that opened a call but never yields a name is emitted as text (without the markers);
- an unfinished header (half a function name) is dropped.

Linear in the input (``bench/parser_adversarial.py``): a value's scan resumes where the last feed
stopped (``JsonScanner``), text that waits for a marker is held as pieces (``HeldText``), and the
buffer between feeds only holds what is still undecided (at most half a marker, or a start marker and
``tool_header.LIMIT`` characters of what may be its call header).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from enum import Enum

from services.parse.parsers.base import HeldText, find_first, partial_marker_len, run_end
from services.parse.parsers.events import Event
from services.parse.parsers.json_scan import JsonScanner, Scan
from services.parse.parsers.tool_core import CallEmitter, ParserContext
from services.parse.parsers.tool_formats import ToolFormat
from services.parse.parsers.tool_header import HeaderProbe
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
    PROBE = 7       # after a start marker: does a call header follow (else the marker is text)?


class MarkedToolParser:
    """Incremental parser of one ``ToolFormat``; one instance per stream."""

    def __init__(self, fmt: ToolFormat, ctx: ParserContext) -> None:
        self._f = fmt.remap(ctx.marker)
        self._ctx = ctx
        self._calls = CallEmitter(ctx.new_call_id)
        self._s = _S.TEXT
        self._buf = ""                # fed text not yet consumed (at most an undecided marker's worth)
        self._lead: list[str] = []    # whitespace opening the output, while a bare_start call may follow
        self._held = HeldText()       # a header waiting for its end marker
        self._probe = HeaderProbe(self._f)
        self._marker = ""             # PROBE: the start marker (text unless a call header follows)
        self._section_end = ""
        self._calls_in_section = 0
        self._array = False
        self._seen_text = False       # bare_start only applies at the very beginning of the output
        self._scanner = JsonScanner()
        self._params: ParamsBody | None = None
        self._object_call = False
        self._sections = dict(self._f.sections)
        self._starts = tuple(self._sections)
        self._between = re.compile(r"[\s" + re.escape(self._f.separators) + "]*")
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
        if self._s is _S.OBJECT:
            body = self._scanner.take() + self._buf
            if body.strip():
                self._calls.text(self._strip_markers(body), events)  # a JSON object that never named a call is text
        self._buf = ""
        self._calls.end_text(events)
        return events

    def _drain(self, *, final: bool) -> list[Event]:
        events: list[Event] = []
        while _STEPS[self._s](self, events, final):
            pass
        return events

    def _open_section(self, end: str) -> None:
        self._s, self._section_end, self._calls_in_section, self._array = _S.SECTION, end, 0, False

    def _wait(self, state: _S, markers: tuple[str, ...]) -> bool:
        self._s, self._held = state, HeldText(markers)
        return True

    # -- states: each returns True when it changed state and draining should go on --------------------

    def _text(self, events: list[Event], final: bool) -> bool:
        f = self._f
        if f.bare_start and not self._seen_text:
            stripped = self._buf.lstrip()
            if stripped[:1] in ("{", "["):
                self._buf, self._marker = stripped, "".join(self._lead) + self._buf[: len(self._buf) - len(stripped)]
                self._lead, self._section_end, self._s = [], "", _S.PROBE
                return True
            if not stripped and not final:
                if self._buf:
                    self._lead.append(self._buf)
                self._buf = ""
                return False
            if self._lead:
                self._buf, self._lead = "".join(self._lead) + self._buf, []
        at, start = find_first(self._buf, self._starts)
        if at >= 0:
            self._calls.text(self._buf[:at], events)
            self._seen_text = True
            self._buf, self._marker = self._buf[at + len(start):], start
            self._section_end, self._s = self._sections[start], _S.PROBE
            return True
        hold = 0 if final else partial_marker_len(self._buf, *self._starts)
        emit, self._buf = self._buf[: len(self._buf) - hold], self._buf[len(self._buf) - hold:]
        self._seen_text = self._seen_text or bool(emit.strip())
        self._calls.text(emit, events)
        return False

    def _probe_header(self, events: list[Event], final: bool) -> bool:
        decided = self._probe.decide(self._buf, final=final)
        if decided is None:
            return False
        if decided:
            self._open_section(self._section_end)
        else:  # not a call: the marker is text, and what follows is read as text again
            self._calls.text(self._marker, events)
            self._seen_text, self._s = True, _S.TEXT
        return True

    def _section(self, events: list[Event], final: bool) -> bool:
        f = self._f
        buf = self._buf[run_end(self._between, self._buf):] if self._calls_in_section else self._buf.lstrip()
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
                    return self._wait(_S.HEADER, f.header_ends)
                else:
                    self._marker, self._section_end, self._s = marker, self._sections[marker], _S.PROBE
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
            self._s, self._scanner = _S.OBJECT, JsonScanner(colons=2)  # the second ":" ends a call's header
            return True
        if f.header_ends and not f.call_start and not self._calls_in_section:
            return self._wait(_S.HEADER, f.header_ends)
        self._s = _S.TEXT  # not a call: the section is over; what follows is text (markers included)
        return True

    def _object(self, events: list[Event], final: bool) -> bool:
        scanner = self._scanner
        while True:
            end, status = scanner.scan(self._buf)
            self._buf = self._buf[end:]
            if status is Scan.DONE:
                self._whole_object(scanner.take(), events)
                self._calls_in_section += 1
                self._s = _S.SECTION
                return True
            if status is not Scan.COLON:
                return False
            if not scanner.colons and self._named_call(scanner.text(), events):
                return True

    def _named_call(self, head: str, events: list[Event]) -> bool:
        """At the object's second top-level ``:``: does ``head`` open a call (``{"name": .., "arguments":``)?"""
        match = _OBJECT_HEADER.match(head)
        if match is None:
            return False
        try:
            name = json.loads('"' + match.group(1) + '"')
        except json.JSONDecodeError:
            return False
        if not isinstance(name, str):
            return False
        self._calls.start(name, events)
        self._buf = head[match.end():] + self._buf
        self._object_call = True
        self._calls_in_section += 1
        self._begin_args()
        return True

    def _whole_object(self, body: str, events: list[Event]) -> None:
        try:
            obj = json.loads(body)
        except (json.JSONDecodeError, RecursionError):
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            self._calls.whole(obj["name"], obj.get("arguments", obj.get("parameters", {})), events)
        else:
            self._calls.text(body, events)

    def _header(self, events: list[Event], final: bool) -> bool:
        f = self._f
        at, end = self._held.add(self._buf)
        self._buf = ""
        if at < 0:
            if final:
                self._s, self._held = _S.TEXT, HeldText()  # half a header carries nothing worth showing
            return False
        held, self._held = self._held.text(), HeldText()
        header = held[:at]
        self._buf = held[at + (0 if end in self._keep else len(end)):]
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
        stops = tuple(m for m in (self._f.call_end, self._section_end) if m)
        self._scanner, self._s = JsonScanner(stops=stops), _S.ARGS

    def _args(self, events: list[Event], final: bool) -> bool:
        scanner = self._scanner
        end, status = scanner.scan(self._buf, final=final)
        self._buf = self._buf[end:]
        if final and status is Scan.MORE:
            scanner.close()
        if scanner.done or not scanner.is_scalar:
            self._calls.args(scanner.take(), events)
        if scanner.done:
            self._calls.dispatch(events)
        elif status is Scan.STOP:
            self._calls.open = False  # the call closed before its arguments did: never dispatched
        else:
            return False
        if self._object_call:  # skip to the end of the object that held the arguments
            stops = (self._section_end,) if self._section_end else ()
            self._s, self._scanner = _S.TAIL, JsonScanner(depth=1, stops=stops, record=False)
        else:
            self._s = _S.TAIL if self._f.call_end else _S.SECTION
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
        buf = self._buf
        if self._object_call:
            end, status = self._scanner.scan(buf, final=final)
            self._buf = buf[end:]
            if status is Scan.MORE:
                return False
            self._s = _S.SECTION
            return True
        stops = tuple(m for m in (self._f.call_end, self._section_end) if m)
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


_STEPS = {
    _S.TEXT: MarkedToolParser._text, _S.SECTION: MarkedToolParser._section, _S.OBJECT: MarkedToolParser._object,
    _S.HEADER: MarkedToolParser._header, _S.ARGS: MarkedToolParser._args, _S.PARAMS: MarkedToolParser._param_body,
    _S.TAIL: MarkedToolParser._tail, _S.PROBE: MarkedToolParser._probe_header,
}
