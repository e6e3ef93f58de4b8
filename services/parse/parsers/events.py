"""The closed vocabulary of events a parser emits (domain types; the service maps them to protobuf)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningDelta:
    """The next piece of the model's reasoning."""

    text: str


@dataclass(frozen=True)
class TextDelta:
    """The next piece of the visible answer."""

    text: str


@dataclass(frozen=True)
class ToolCallStart:
    """A tool call began; its name is known."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgumentsDelta:
    """The next piece of a tool call's arguments JSON text."""

    index: int
    id: str
    delta: str


@dataclass(frozen=True)
class ToolCallDispatch:
    """A tool call's arguments are complete; ``arguments_json`` equals the concatenated deltas."""

    index: int
    id: str
    name: str
    arguments_json: str


Event = ReasoningDelta | TextDelta | ToolCallStart | ToolCallArgumentsDelta | ToolCallDispatch


def merge_deltas(events: list[Event]) -> list[Event]:
    """Join adjacent deltas of the same kind (and same call), so batching does not change the result."""
    out: list[Event] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, ReasoningDelta) and isinstance(last, ReasoningDelta):
            out[-1] = ReasoningDelta(last.text + event.text)
        elif isinstance(event, TextDelta) and isinstance(last, TextDelta):
            out[-1] = TextDelta(last.text + event.text)
        elif (
            isinstance(event, ToolCallArgumentsDelta)
            and isinstance(last, ToolCallArgumentsDelta)
            and last.index == event.index
        ):
            out[-1] = ToolCallArgumentsDelta(last.index, last.id, last.delta + event.delta)
        elif isinstance(event, ReasoningDelta | TextDelta) and not event.text:
            continue
        else:
            out.append(event)
    return out
