"""Token ids -> events: incremental detokenizer, then the reasoning parser, then the tool parser."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from services.parse.parsers.base import OutputParser
from services.parse.parsers.events import Event, TextDelta, ToolCallDispatch, merge_deltas


class IncrementalDetokenizer:
    """Decodes a token stream piece by piece; multi-byte characters split across tokens come out whole.

    Special tokens are kept (format markers must stay visible) except ``hidden_ids`` (end of turn).
    """

    def __init__(self, tokenizer: Tokenizer, hidden_ids: Collection[int] = ()) -> None:
        self._tokenizer = tokenizer
        self._hidden = frozenset(hidden_ids)
        self._stream = DecodeStream(skip_special_tokens=False)

    def feed(self, token_ids: Sequence[int]) -> str:
        pieces: list[str] = []
        for token_id in token_ids:
            if token_id in self._hidden:
                continue
            piece = self._stream.step(self._tokenizer, token_id)
            if piece:
                pieces.append(piece)
        return "".join(pieces)


class OutputPipeline:
    """One per stream: ``feed`` each batch of token ids, ``finish`` once; returns merged events.

    The tool parser sees only the text the reasoning parser classified as answer text.
    """

    def __init__(
        self,
        detokenizer: IncrementalDetokenizer,
        reasoning: OutputParser | None = None,
        tools: OutputParser | None = None,
    ) -> None:
        self._detokenizer = detokenizer
        self._reasoning = reasoning
        self._tools = tools
        self.tool_calls = 0

    def feed(self, token_ids: Sequence[int]) -> list[Event]:
        text = self._detokenizer.feed(token_ids)
        if not text:
            return []
        first: list[Event] = self._reasoning.feed(text, token_ids) if self._reasoning else [TextDelta(text)]
        return self._route(first, final=False)

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
        return merge_deltas(out)
