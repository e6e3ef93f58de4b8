"""Token ids -> events: incremental detokenizer, then the reasoning parser, then the tool parser."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from services.parse.parsers.base import OutputParser
from services.parse.parsers.events import (
    Event,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallDispatch,
    ToolCallStart,
    merge_deltas,
)

SENTINEL_BASE = 0xF0000  # Unicode plane 15 (private use): never produced by ordinary text


class MarkerIds:
    """Format markers the tokenizer has as single added tokens: matched by token id, never by look-alike text.

    The detokenizer writes each such token as a one-character sentinel; parsers built with ``marker``
    search for the sentinel; ``restore`` turns sentinels left in event text back into the marker text.
    """

    def __init__(self, tokenizer: Tokenizer | None = None, markers: Iterable[str] = ()) -> None:
        self.by_id: dict[int, tuple[str, str]] = {}       # token id -> (marker text, sentinel)
        self._sentinel: dict[str, str] = {}
        added = {t.content for t in tokenizer.get_added_tokens_decoder().values()} if tokenizer else set()
        for text in sorted(set(markers) & added):
            token_id = tokenizer.token_to_id(text) if tokenizer else None
            if token_id is None:
                continue
            sentinel = chr(SENTINEL_BASE + len(self._sentinel))
            self._sentinel[text] = sentinel
            self.by_id[token_id] = (text, sentinel)
        self._restore = str.maketrans({s: m for m, s in self._sentinel.items()})

    def marker(self, text: str) -> str:
        """What the decoded stream carries for ``text``."""
        return self._sentinel.get(text, text)

    def restore(self, events: list[Event]) -> list[Event]:
        if not self._sentinel:
            return events
        table = self._restore
        out: list[Event] = []
        for e in events:
            if isinstance(e, ReasoningDelta | TextDelta):
                e = dataclasses.replace(e, text=e.text.translate(table))
            elif isinstance(e, ToolCallArgumentsDelta):
                e = dataclasses.replace(e, delta=e.delta.translate(table))
            elif isinstance(e, ToolCallDispatch):
                e = dataclasses.replace(e, arguments_json=e.arguments_json.translate(table),
                                        name=e.name.translate(table))
            elif isinstance(e, ToolCallStart):
                e = dataclasses.replace(e, name=e.name.translate(table))
            out.append(e)
        return out


class IncrementalDetokenizer:
    """Decodes a token stream piece by piece; multi-byte characters split across tokens come out whole.

    Special tokens are kept (format markers must stay visible) except ``hidden_ids`` (end of turn);
    marker tokens in ``markers`` come out as their sentinels.
    """

    def __init__(self, tokenizer: Tokenizer, hidden_ids: Collection[int] = (), markers: MarkerIds | None = None):
        self._tokenizer = tokenizer
        self._hidden = frozenset(hidden_ids)
        self._markers = markers.by_id if markers else {}
        self._stream = DecodeStream(skip_special_tokens=False)

    def feed(self, token_ids: Sequence[int]) -> str:
        pieces: list[str] = []
        for token_id in token_ids:
            if token_id in self._hidden:
                continue
            piece = self._stream.step(self._tokenizer, token_id)
            marker = self._markers.get(token_id)
            if marker is not None:
                piece = (piece or "").removesuffix(marker[0]) + marker[1]
            if piece:
                pieces.append(piece)
        return "".join(pieces)


def carried_call_ids(ids: Iterable[str], then: Callable[[], str]) -> Callable[[], str]:
    """A ``new_call_id`` that hands out ``ids`` first (the calls a resumed stream already sent), then ``then()``."""
    pending = iter(tuple(ids))
    return lambda: next(pending, None) or then()


class OutputPipeline:
    """One per stream: ``feed`` each batch of token ids, ``finish`` once; returns merged events.

    The tool parser sees only the text the reasoning parser classified as answer text.
    """

    def __init__(
        self,
        detokenizer: IncrementalDetokenizer,
        reasoning: OutputParser | None = None,
        tools: OutputParser | None = None,
        markers: MarkerIds | None = None,
    ) -> None:
        self._detokenizer = detokenizer
        self._markers = markers or MarkerIds()
        self._reasoning = reasoning
        self._tools = tools
        self.tool_calls = 0

    def feed(self, token_ids: Sequence[int]) -> list[Event]:
        text = self._detokenizer.feed(token_ids)
        if not text:
            return []
        first: list[Event] = self._reasoning.feed(text, token_ids) if self._reasoning else [TextDelta(text)]
        return self._route(first, final=False)

    def replay(self, frames: Iterable[Sequence[int]]) -> Iterator[list[Event]]:
        """Feed ``frames`` (token ids, frame by frame as they first came) and yield each one's events, for the
        caller to account and drop: a stream resumed elsewhere rebuilds the state (detokenizer, reasoning and
        tool parsers, call ids, ``tool_calls``) its first pipeline had after the same frames, deterministically,
        and emits only what comes after. Same frames as the first stream, so the same events and state."""
        for frame in frames:
            yield self.feed(frame)

    def finish(self) -> list[Event]:
        first = self._reasoning.finish() if self._reasoning else []
        return self._route(first, final=True)

    def _route(self, events: list[Event], *, final: bool) -> list[Event]:
        out: list[Event] = []
        for event in events:
            if isinstance(event, TextDelta) and self._tools is not None:
                out.extend(self._tools.feed(event.text, ()))
            else:
                out.append(event)
        if final and self._tools is not None:
            out.extend(self._tools.finish())
        self.tool_calls += sum(isinstance(e, ToolCallDispatch) for e in out)
        return self._markers.restore(merge_deltas(out))
