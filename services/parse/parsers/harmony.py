"""gpt-oss Harmony output: messages with a header (channel, optional recipient) and a body.

``<|channel|>analysis<|message|>..<|end|>`` is reasoning, ``<|channel|>final<|message|>..<|return|>``
and recipient-less ``commentary`` (preambles) are answer text. A message addressed to a tool
(``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{..}<|call|>``) is passed on
unchanged, re-framed as ``<|channel|>HEADER<|message|>BODY<|call|>``, for the ``harmony`` tool parser.
``<|start|>assistant`` between messages is dropped. Output that starts with no header at all is text.
A header is held as pieces until its ``<|message|>`` (linear however long it runs).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from enum import Enum

from services.parse.parsers.base import HeldText, find_first, partial_marker_len
from services.parse.parsers.events import Event, ReasoningDelta, TextDelta

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
HARMONY_MARKERS = (START, CHANNEL, MESSAGE, "<|constrain|>", *ENDS)
_CHANNEL_NAME = re.compile(r"\s*(\w+)")


class _Mode(Enum):
    HEADER = "header"
    REASONING = "reasoning"
    TEXT = "text"
    TOOL = "tool"


class HarmonyReasoningParser:
    """``gpt_oss``: Harmony channels -> reasoning / text; tool-addressed messages pass through raw."""

    def __init__(self, marker: Callable[[str], str] = str) -> None:
        self._m = {name: marker(name) for name in HARMONY_MARKERS}
        self._ends = tuple(self._m[e] for e in ENDS)
        self._buf = ""                # body text not yet emitted (at most half an end marker)
        self._header = HeldText((self._m[MESSAGE],))
        self._mode = _Mode.HEADER
        self._first = True

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Event]:
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[Event]:
        return self._drain(final=True)

    def _drain(self, *, final: bool) -> list[Event]:
        events: list[Event] = []
        m = self._m
        while True:
            if self._mode is _Mode.HEADER:
                at, _ = self._header.add(self._buf)
                self._buf = ""
                head = self._header.head
                if self._first and head and not any(
                    head.startswith(x) or x.startswith(head) for x in (m[START], m[CHANNEL])
                ):
                    self._buf, self._header = self._header.text(), HeldText((m[MESSAGE],))
                    self._mode = _Mode.TEXT  # no Harmony framing at all: plain text
                    self._first = False
                    continue
                if at < 0:
                    if final:  # an unfinished header carries no content: dropped (never leaks markers)
                        self._header = HeldText((m[MESSAGE],))
                    return events
                self._first = False
                held, self._header = self._header.text(), HeldText((m[MESSAGE],))
                header = held[:at].replace(m[START], "").removeprefix("assistant")
                self._buf = held[at + len(m[MESSAGE]):]
                self._mode = self._classify(header, events)
                continue
            at, end = find_first(self._buf, self._ends)
            upto = at if at >= 0 else len(self._buf) - (0 if final else partial_marker_len(self._buf, *self._ends))
            body, self._buf = self._buf[:upto], self._buf[upto:]
            if body:
                events.append(ReasoningDelta(body) if self._mode is _Mode.REASONING else TextDelta(body))
            if at < 0:
                if final and self._mode is _Mode.TOOL:
                    events.append(TextDelta(m["<|call|>"]))  # the tool parser's recovery rule decides
                return events
            self._buf = self._buf[len(end):]
            if self._mode is _Mode.TOOL:
                events.append(TextDelta(m["<|call|>"]))
            self._mode = _Mode.HEADER

    def _classify(self, header: str, events: list[Event]) -> _Mode:
        if "to=" in header:
            channel = header if header.startswith(self._m[CHANNEL]) else self._m[CHANNEL] + header
            events.append(TextDelta(channel + self._m[MESSAGE]))
            return _Mode.TOOL
        match = _CHANNEL_NAME.match(header.replace(self._m[CHANNEL], " "))
        return _Mode.REASONING if match and match.group(1) == "analysis" else _Mode.TEXT
