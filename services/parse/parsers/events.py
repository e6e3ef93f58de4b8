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


def _piece(event: Event) -> str | None:
    if isinstance(event, ReasoningDelta | TextDelta):
        return event.text
    return event.delta if isinstance(event, ToolCallArgumentsDelta) else None


def _same_run(last: Event | None, event: Event) -> bool:
    if isinstance(event, ToolCallArgumentsDelta):
        return isinstance(last, ToolCallArgumentsDelta) and last.index == event.index
    return isinstance(event, ReasoningDelta | TextDelta) and type(last) is type(event)


def _joined(first: Event, pieces: list[str]) -> Event:
    text = "".join(pieces)
    if isinstance(first, ToolCallArgumentsDelta):
        return ToolCallArgumentsDelta(first.index, first.id, text)
    return ReasoningDelta(text) if isinstance(first, ReasoningDelta) else TextDelta(text)


def merge_deltas(events: list[Event]) -> list[Event]:
    """Join adjacent deltas of the same kind (and same call), so batching does not change the result.

    Each run is joined once (linear in its length); empty text deltas outside a run are dropped.
    """
    out: list[Event] = []
    pieces: list[str] = []      # the texts of the run ending at out[-1]
    for event in events:
        piece = _piece(event)
        if piece is not None and out and _same_run(out[-1], event):
            pieces.append(piece)
            continue
        if isinstance(event, ReasoningDelta | TextDelta) and not event.text:
            continue
        if len(pieces) > 1:
            out[-1] = _joined(out[-1], pieces)
        out.append(event)
        pieces = [piece] if piece is not None else []
    if len(pieces) > 1:
        out[-1] = _joined(out[-1], pieces)
    return out
