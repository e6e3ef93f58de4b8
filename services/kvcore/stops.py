"""Incremental detokenization with stop-string matching, at token granularity.

The stream carries token ids, so "the stop string is not emitted" means: tokens whose text could
still turn out to be the start of a stop string are held back; when a stop string completes, every
token whose text reaches into it is dropped (text before the stop string inside that same token is
lost — a token-level approximation of vLLM's text truncation); when the request ends for another
reason the held tokens are released.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer


class StopStringMatcher:
    """Per-request detokenizer and stop-string detector (see module docstring)."""

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str]) -> None:
        self._tokenizer = tokenizer
        self._stops = [s for s in stop if s]
        self._max_len = max((len(s) for s in self._stops), default=0)
        self._ids: list[int] = []
        self._ends: list[int] = []        # text length after each token
        self._released = 0
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""
        self.stop_string = ""

    @property
    def active(self) -> bool:
        return bool(self._stops)

    def push(self, token_id: int) -> list[int]:
        """Add a generated token; return the tokens that are safe to emit now."""
        if not self._stops:
            return [token_id]
        before = len(self.text)
        self._ids.append(token_id)
        self._detokenize()
        self._ends.append(len(self.text))
        start = max(0, before - self._max_len + 1)
        hit: tuple[int, str] | None = None
        for s in self._stops:
            idx = self.text.find(s, start)
            if idx >= 0 and (hit is None or idx < hit[0]):
                hit = (idx, s)
        if hit is not None:
            self.stop_string = hit[1]
            return self._release_until(hit[0])
        return self._release_until(len(self.text) - self._held_suffix())

    def flush(self) -> list[int]:
        """The request ended for another reason: release everything held back."""
        out = self._ids[self._released :]
        self._released = len(self._ids)
        return out

    def _release_until(self, char_limit: int) -> list[int]:
        start = self._released
        while self._released < len(self._ids) and self._ends[self._released] <= char_limit:
            self._released += 1
        if self.stop_string:  # tokens after the cut are dropped for good
            out = self._ids[start : self._released]
            self._released = len(self._ids)
            return out
        return self._ids[start : self._released]

    def _held_suffix(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of a stop string."""
        tail = self.text[-self._max_len :]
        for k in range(min(len(tail), self._max_len - 1), 0, -1):
            suffix = tail[-k:]
            if any(s.startswith(suffix) for s in self._stops):
                return k
        return 0

    def _detokenize(self) -> None:
        # vLLM-style: decode a small window so multi-byte characters split over tokens come out whole.
        prefix = self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._tokenizer.decode(self._ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.text += full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
