"""Reasoning blocks delimited by start/end markers (Qwen3's ``<think>...</think>``), as a small state machine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.parse.parsers.base import partial_marker_len
from services.parse.parsers.events import Event, ReasoningDelta, TextDelta


@dataclass(frozen=True)
class ReasoningFormat:
    """A model family's reasoning markers, as data."""

    start: str
    end: str
    separator: str = "\n\n"       # what the model writes after ``end``; not part of the answer


QWEN3 = ReasoningFormat(start="<think>", end="</think>")


class TaggedReasoningParser:
    """Splits text into reasoning (inside ``start``/``end``) and answer text.

    Strips the single newline right after ``start`` and right before ``end``, and the separator after
    ``end``. Half a marker at the end of the input is held back until the next delta (or ``finish``)
    resolves it. Several reasoning blocks per turn are allowed (reasoning interleaved with tool calls).
    """

    def __init__(self, fmt: ReasoningFormat, *, in_reasoning: bool = False, strip_leading_newline: bool = False):
        self._fmt = fmt
        self._buf = ""
        self._in_reasoning = in_reasoning
        self._strip_leading = in_reasoning and strip_leading_newline
        self._separator_left = ""

    @classmethod
    def for_prompt(cls, fmt: ReasoningFormat, prompt: str) -> TaggedReasoningParser:
        """A parser that starts in reasoning mode when ``prompt`` ends inside an open reasoning block."""
        open_at = prompt.rfind(fmt.start)
        in_reasoning = open_at >= 0 and open_at > prompt.rfind(fmt.end)
        return cls(fmt, in_reasoning=in_reasoning, strip_leading_newline=prompt.endswith(fmt.start))

    @property
    def in_reasoning(self) -> bool:
        return self._in_reasoning

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Event]:
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[Event]:
        return self._drain(final=True)

    def _drain(self, *, final: bool) -> list[Event]:
        events: list[Event] = []
        fmt = self._fmt
        while True:
            if self._in_reasoning:
                if self._strip_leading:
                    if not self._buf and not final:
                        break
                    if self._buf.startswith("\n"):
                        self._buf = self._buf[1:]
                    self._strip_leading = False
                at = self._buf.find(fmt.end)
                if at >= 0:
                    content = self._buf[:at]
                    if content.endswith("\n"):
                        content = content[:-1]
                    if content:
                        events.append(ReasoningDelta(content))
                    self._buf = self._buf[at + len(fmt.end):]
                    self._in_reasoning = False
                    self._separator_left = fmt.separator
                    continue
                hold = 0 if final else partial_marker_len(self._buf, "\n" + fmt.end, fmt.end)
                emit, self._buf = self._buf[: len(self._buf) - hold], self._buf[len(self._buf) - hold:]
                if emit:
                    events.append(ReasoningDelta(emit))
                break
            while self._separator_left and self._buf and self._buf[0] == self._separator_left[0]:
                self._buf = self._buf[1:]
                self._separator_left = self._separator_left[1:]
            if self._separator_left:
                if not self._buf and not final:
                    break
                self._separator_left = ""
            at = self._buf.find(fmt.start)
            if at >= 0:
                if at:
                    events.append(TextDelta(self._buf[:at]))
                self._buf = self._buf[at + len(fmt.start):]
                self._in_reasoning = True
                self._strip_leading = True
                continue
            hold = 0 if final else partial_marker_len(self._buf, fmt.start)
            emit, self._buf = self._buf[: len(self._buf) - hold], self._buf[len(self._buf) - hold:]
            if emit:
                events.append(TextDelta(emit))
            break
        return events


def qwen3_reasoning_parser(prompt: str) -> TaggedReasoningParser:
    """Qwen3 ``<think>`` blocks; starts in reasoning mode if the prompt opened one."""
    return TaggedReasoningParser.for_prompt(QWEN3, prompt)
