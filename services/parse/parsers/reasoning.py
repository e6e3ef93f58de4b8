"""Reasoning blocks delimited by markers, as one small state machine driven by a table of formats.

Every marker-delimited family (``<think>``, ``[THINK]``, ``◁think▷``, Granite's phrases) is a
``ReasoningFormat`` row in ``REASONING_FORMATS``; ``TaggedReasoningParser`` runs any of them. Harmony
(gpt-oss) has channels instead of markers and lives in ``harmony.py``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.parse.parsers.base import find_first, partial_marker_len, run_end
from services.parse.parsers.events import Event, ReasoningDelta, TextDelta


@dataclass(frozen=True)
class ReasoningFormat:
    """A model family's reasoning markers, as data.

    ``inner``: whitespace the template writes right after the opener and right before the closer (not
    reasoning). ``separator``: what the template writes after the closer (not answer text). ``forced``:
    the model starts inside reasoning without writing the opener (DeepSeek-R1, MiniMax-M2, ...), so text
    before the first closer is reasoning whatever the prompt says, unless the prompt ends with a closed
    block (thinking switched off). ``implicit_ends``: markers that end reasoning without a closer and stay
    in the text (Kimi K2.5's tool section), only when one of ``implicit_follows`` comes next (after
    whitespace: the section's first call); otherwise the marker is reasoning text. ``drop_stray_ends``: a
    closer met outside reasoning is markup and is dropped (its text on both sides stays answer text); off
    for Granite, whose markers are prose.
    """

    starts: tuple[str, ...]
    ends: tuple[str, ...]
    inner: str = "\n"
    separator: str = "\n\n"
    forced: bool = False
    implicit_ends: tuple[str, ...] = ()
    implicit_follows: tuple[str, ...] = ()
    drop_stray_ends: bool = True

    @property
    def markers(self) -> tuple[str, ...]:
        return (*self.starts, *self.ends, *self.implicit_ends)

    def remap(self, marker: Callable[[str], str]) -> ReasoningFormat:
        """The same format with every marker passed through ``marker`` (token-id sentinels)."""
        return dataclasses.replace(
            self,
            starts=tuple(map(marker, self.starts)),
            ends=tuple(map(marker, self.ends)),
            implicit_ends=tuple(map(marker, self.implicit_ends)),
            implicit_follows=tuple(map(marker, self.implicit_follows)),
        )

    def open_in(self, prompt: str) -> bool:
        """True when generation after ``prompt`` starts inside reasoning.

        The prompt left a block open (the template wrote the opener), or the family is forced and the
        prompt does not end with a closed block (``<think>\\n\\n</think>\\n\\n``: thinking switched off).
        """
        opened = max((prompt.rfind(s) for s in self.starts), default=-1)
        closed = max((prompt.rfind(e) for e in self.ends), default=-1)
        if opened > closed:
            return True
        return self.forced and not self.closed_at_end(prompt)

    def closed_at_end(self, prompt: str) -> bool:
        """True when ``prompt`` ends (but for whitespace) with a closer: the template switched thinking off."""
        tail = prompt.rstrip()
        return any(tail.endswith(e) for e in self.ends)


_SPACE = re.compile(r"\s*")
_GAP = 16  # whitespace between an implicit end and the call that makes it one

THINK = ReasoningFormat(starts=("<think>",), ends=("</think>",))
FORCED_THINK = dataclasses.replace(THINK, forced=True)

# Public names (Dynamo's and vLLM's) -> formats. Aliases share a row. Which families are forced follows
# Dynamo's ``force_reasoning`` and vLLM's parsers; docs/parsers.md records the audit and where we differ.
REASONING_FORMATS: dict[str, ReasoningFormat] = {
    "basic": THINK,
    "qwen3": THINK,
    # A tool-call section cannot be inside reasoning: it ends a forced block the model never closed.
    "deepseek_r1": dataclasses.replace(FORCED_THINK, implicit_ends=("<｜tool▁calls▁begin｜>",),  # noqa: RUF001
                                       implicit_follows=("<｜tool▁call▁begin｜>",)),  # noqa: RUF001
    "deepseek_v3": THINK,
    "deepseek_v3_1": THINK,
    "nemotron_deci": THINK,
    "nemotron_nano": FORCED_THINK,
    "nemotron3": FORCED_THINK,
    "glm45": dataclasses.replace(THINK, inner="", separator=""),
    "kimi": ReasoningFormat(starts=("◁think▷",), ends=("◁/think▷",), inner="", separator=""),
    "kimi_k25": dataclasses.replace(FORCED_THINK, implicit_ends=("<|tool_calls_section_begin|>",),
                                    implicit_follows=("<|tool_call_begin|>",)),
    "mistral": ReasoningFormat(starts=("[THINK]",), ends=("[/THINK]",), inner="", separator=""),
    "granite": ReasoningFormat(
        starts=("Here is my thought process:", "Here's my thought process:"),
        ends=("Here is my response:", "Here's my response:"),
        separator="\n",
        drop_stray_ends=False,
    ),
    "minimax_m2": dataclasses.replace(FORCED_THINK, implicit_ends=("<minimax:tool_call>",),
                                      implicit_follows=('<invoke name="',)),
    "step3": FORCED_THINK,
}


class TaggedReasoningParser:
    """Splits text into reasoning (between a start and an end marker) and answer text.

    The format's ``inner`` whitespace and ``separator`` are the template's, not content, and are
    dropped. Half a marker at the end of the input is held back until the next delta (or ``finish``)
    resolves it. Several reasoning blocks per turn are allowed (reasoning interleaved with tool calls).
    A forced family that writes its opener anyway has it dropped. Output truncated inside reasoning
    ends as reasoning. A closer outside reasoning is dropped (``drop_stray_ends``), never streamed as
    answer text; the text before it was already streamed as answer text and stays so.
    """

    def __init__(self, fmt: ReasoningFormat, *, in_reasoning: bool = False, strip_inner: bool = True) -> None:
        self._fmt = fmt
        self._buf = ""
        self._in_reasoning = in_reasoning
        self._at_start = True           # nothing seen yet: a forced family's opener may still come
        self._strip_inner = in_reasoning and strip_inner and bool(fmt.inner)
        self._separator_left = ""
        closers = (*fmt.ends, *fmt.implicit_ends)
        self._end_hold = tuple(fmt.inner + e for e in closers) + closers
        self._text_marks = fmt.starts + (fmt.ends if fmt.drop_stray_ends else ())

    @classmethod
    def for_prompt(cls, fmt: ReasoningFormat, prompt: str, marker: Callable[[str], str] = str) -> TaggedReasoningParser:
        """A parser that starts in reasoning mode when ``prompt`` ends inside an open reasoning block."""
        ends_with_opener = any(prompt.endswith(s) for s in fmt.starts)
        return cls(fmt.remap(marker), in_reasoning=fmt.open_in(prompt), strip_inner=ends_with_opener)

    @property
    def in_reasoning(self) -> bool:
        return self._in_reasoning

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Event]:
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[Event]:
        return self._drain(final=True)

    def _drop_prefix(self, prefix: str, *, final: bool) -> bool:
        """Drop ``prefix`` from the buffer if it starts with it; False while it cannot tell yet."""
        if self._buf.startswith(prefix):
            self._buf = self._buf[len(prefix):]
            return True
        return final or not prefix.startswith(self._buf)

    def _drain(self, *, final: bool) -> list[Event]:
        events: list[Event] = []
        fmt = self._fmt
        while True:
            if self._in_reasoning:
                if self._at_start and fmt.forced:
                    if not all(self._drop_prefix(s, final=final) for s in fmt.starts):
                        break
                    self._at_start = False
                    self._strip_inner = bool(fmt.inner)
                if self._strip_inner:
                    if not self._drop_prefix(fmt.inner, final=final):
                        break
                    self._strip_inner = False
                self._at_start = False
                at, end = find_first(self._buf, fmt.ends)
                implicit, decided = self._implicit_end(final)
                if implicit >= 0 and (at < 0 or implicit < at):
                    before = self._buf[:implicit].removesuffix(fmt.inner)
                    self._emit(ReasoningDelta, before, events)
                    self._buf = self._buf[implicit if decided else len(before):]
                    if not decided:
                        break  # maybe the tool section: what follows the marker decides
                    self._in_reasoning = False
                    continue
                if at >= 0:
                    self._emit(ReasoningDelta, self._buf[:at].removesuffix(fmt.inner), events)
                    self._buf = self._buf[at + len(end):]
                    self._in_reasoning = False
                    self._separator_left = fmt.separator
                    continue
                hold = 0 if final else partial_marker_len(self._buf, *self._end_hold)
                self._emit(ReasoningDelta, self._buf[: len(self._buf) - hold], events)
                self._buf = self._buf[len(self._buf) - hold:]
                break
            self._at_start = False
            while self._separator_left and self._buf and self._buf[0] == self._separator_left[0]:
                self._buf = self._buf[1:]
                self._separator_left = self._separator_left[1:]
            if self._separator_left:
                if not self._buf and not final:
                    break
                self._separator_left = ""
            at, mark = find_first(self._buf, self._text_marks)
            if at >= 0:
                self._emit(TextDelta, self._buf[:at], events)
                self._buf = self._buf[at + len(mark):]
                if mark in fmt.ends:    # a stray closer: markup, dropped; no block opens
                    continue
                self._in_reasoning = True
                self._strip_inner = bool(fmt.inner)
                continue
            hold = 0 if final else partial_marker_len(self._buf, *self._text_marks)
            self._emit(TextDelta, self._buf[: len(self._buf) - hold], events)
            self._buf = self._buf[len(self._buf) - hold:]
            break
        return events

    def _implicit_end(self, final: bool) -> tuple[int, bool]:
        """(where an implicit end ends reasoning, True), (where one that may still do so begins, False), or
        (-1, False). One followed by anything but ``implicit_follows`` is reasoning text."""
        fmt, buf, start = self._fmt, self._buf, 0
        while True:
            at, mark = -1, ""
            for m in fmt.implicit_ends:
                i = buf.find(m, start)
                if i >= 0 and (at < 0 or i < at):
                    at, mark = i, m
            if at < 0 or not fmt.implicit_follows:
                return at, at >= 0
            after = at + len(mark)
            gap = run_end(_SPACE, buf[after:after + _GAP + 1])
            rest = buf[after + gap:after + gap + 64]
            if any(rest.startswith(f) for f in fmt.implicit_follows):
                return at, True
            if not final and gap <= _GAP and any(f.startswith(rest) for f in fmt.implicit_follows):
                return at, False
            start = at + 1

    @staticmethod
    def _emit(kind: type[ReasoningDelta] | type[TextDelta], text: str, events: list[Event]) -> None:
        if text:
            events.append(kind(text))


class AppendThinkParser:
    """``minimax_append_think``: no reasoning split; the answer text gets the ``<think>`` the model skipped.

    For clients that parse ``<think>`` themselves: everything is text, prefixed with the opener (so the
    client sees a whole block), as vLLM's ``minimax_m2_append_think`` does whatever the prompt says;
    only a prompt that switched thinking off (ends with a closed block) gets no opener.
    """

    def __init__(self, opener: str) -> None:
        self._pending = opener

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Event]:
        out, self._pending = self._pending + text, ""
        return [TextDelta(out)] if out else []

    def finish(self) -> list[Event]:
        return self.feed("")


def append_think_opener(prompt: str) -> str:
    """The opener ``minimax_append_think`` restores: the prompt's ``<think>\\n`` when it left one open,
    ``<think>`` when it wrote none (the model starts in reasoning), nothing when it closed the block."""
    if THINK.open_in(prompt):
        return "<think>\n"
    return "" if THINK.closed_at_end(prompt) else "<think>"
