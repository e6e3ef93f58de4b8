"""``usage.reasoning_tokens``: the output tokens the reasoning parser classified as reasoning.

The parsers work on text, so the count is kept per router frame, from the frame's token count and the
events the pipeline made of it (no per-token work, nothing allocated):

- a frame whose events are all reasoning counts whole; a frame with reasoning and other output (the end
  of a reasoning block, batched) counts in proportion of its reasoning characters;
- a frame that produced no event (a marker, text held back until a marker resolves, half a UTF-8
  character) waits for the next frame that does; it counts as reasoning only when reasoning is on both
  sides, so the markers that open and close a block, and the whitespace the parser trims next to them,
  are not reasoning (vLLM counts the tokens between the markers, that whitespace included).

Exact when frames are single tokens (an engine step's frame, the common case); when the consumer fell
behind and a frame carries several tokens, the frames at a block's two ends may count their marker
tokens in.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.parse.parsers.events import Event, ReasoningDelta, TextDelta, ToolCallArgumentsDelta, ToolCallStart


class ReasoningTokenCounter:
    """Counts one stream's reasoning tokens; ``feed`` every frame's token count and events, read ``total``."""

    __slots__ = ("_in_reasoning", "_pending", "total")

    def __init__(self) -> None:
        self.total = 0
        self._pending = 0  # tokens of frames that produced no event yet
        self._in_reasoning = False  # whether the last event was reasoning

    def feed(self, tokens: int, events: Sequence[Event]) -> None:
        if not events:
            self._pending += tokens
            return
        reasoning = other = 0
        for event in events:
            if isinstance(event, ReasoningDelta):
                reasoning += len(event.text)
            elif isinstance(event, TextDelta):
                other += len(event.text)
            elif isinstance(event, ToolCallArgumentsDelta):
                other += len(event.delta)
            elif isinstance(event, ToolCallStart):
                other += len(event.name)
        if self._pending and self._in_reasoning and isinstance(events[0], ReasoningDelta):
            self.total += self._pending
        self._pending = 0
        if reasoning:
            self.total += tokens if not other else round(tokens * reasoning / (reasoning + other))
        self._in_reasoning = isinstance(events[-1], ReasoningDelta)
