"""Incremental output parsers: model text -> ordered typed events. Pure, synchronous, no I/O."""

from services.parse.parsers.events import (
    Event,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallDispatch,
    ToolCallStart,
)

__all__ = [
    "Event",
    "ReasoningDelta",
    "TextDelta",
    "ToolCallArgumentsDelta",
    "ToolCallDispatch",
    "ToolCallStart",
]
