"""Simulated output: what an engine without a model generates, known before the step that produces it.

:class:`TokenSource` yields a request's tokens (scripted ones, EOS, then seeded filler forever);
a request that carries one lets the scheduler hold the generated token's KV when the step is
scheduled (``scheduler.py``). The mocker engine and the replay simulator both use it.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from itertools import islice

import xxhash
from tokenizers import Tokenizer

from services.common import token_bytes


class FillerVocabulary:
    """Token ids of plain words (``Ġword``-style, no special tokens) plus a sentence end, for filler text."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        special = {tok.content for tok in tokenizer.get_added_tokens_decoder().values()}
        words: list[int] = []
        for text, token_id in tokenizer.get_vocab(with_added_tokens=False).items():
            if text in special:
                continue
            body = text[1:] if text[:1] in ("Ġ", "▁") else ""
            if len(body) >= 2 and body.isascii() and body.isalpha():
                words.append(token_id)
        if not words:  # an unusual vocabulary: fall back to any non-special token
            words = [i for t, i in tokenizer.get_vocab(with_added_tokens=False).items() if t not in special]
        self.words = sorted(words)
        self.period = tokenizer.token_to_id(".")


class FillerText:
    """Deterministic pseudo-prose: words with an occasional full stop.

    The draws are exactly ``random.Random(seed)``'s ``choice(words)`` and ``randint(6, 16)`` (CPython's
    ``_randbelow``: ``getrandbits`` of ``n.bit_length()`` bits until below ``n``), made here without their
    two layers of method calls: a simulated token costs one ``getrandbits``.
    """

    def __init__(self, vocab: FillerVocabulary, seed: int) -> None:
        self._vocab = vocab
        self._rng = random.Random(seed)
        self._bits = self._rng.getrandbits
        self._words = vocab.words
        self._n = len(vocab.words)
        self._k = self._n.bit_length()
        if not self._n:
            raise IndexError("Cannot choose from an empty sequence")
        self._until_period = 6 + self._below(11)

    def _below(self, n: int) -> int:
        bits, k = self._bits, n.bit_length()
        r = bits(k)
        while r >= n:
            r = bits(k)
        return r

    def next(self) -> int:
        self._until_period -= 1
        if self._until_period <= 0 and self._vocab.period is not None:
            self._until_period = 6 + self._below(11)
            return self._vocab.period
        bits, n, k = self._bits, self._n, self._k
        r = bits(k)
        while r >= n:
            r = bits(k)
        return self._words[r]

    def take(self, count: int) -> list[int]:
        """The next ``count`` tokens: :meth:`next` ``count`` times, in one loop."""
        bits, words, n, k, period = self._bits, self._words, self._n, self._k, self._vocab.period
        out: list[int] = []
        until = self._until_period
        for _ in range(count):
            until -= 1
            if until <= 0 and period is not None:
                until = 6 + self._below(11)
                out.append(period)
            else:
                r = bits(k)
                while r >= n:
                    r = bits(k)
                out.append(words[r])
        self._until_period = until
        return out


def filler_seed(token_ids: Sequence[int] | bytes, seed: int, request_seed: int | None = None) -> int:
    """Seed for a request's filler: its prompt (the ids, or the ids packed as ``token_bytes`` packs them), the
    worker's seed and the request's own seed."""
    data = token_ids if isinstance(token_ids, bytes) else token_bytes.pack(token_ids)  # one C call
    return xxhash.xxh3_64_intdigest(data, seed=(seed + (request_seed or 0)) & 0xFFFFFFFFFFFFFFFF)


class TokenSource:
    """The tokens one request will generate: scripted tokens, then EOS, then filler forever."""

    def __init__(self, scripted: Sequence[int], eos: int | None, filler: FillerText, *,
                 scripted_reply: bool | None = None) -> None:
        """``scripted_reply``: the request has a scripted reply even when ``scripted`` is empty (a continuation
        whose earlier attempt generated all of it: EOS comes next); by default, when ``scripted`` is not empty."""
        self._scripted = list(scripted)
        if eos is not None and (scripted if scripted_reply is None else scripted_reply):
            self._scripted.append(eos)
        self._pos = 0
        self._filler = filler
        self._peeked: int | None = None
        self._ahead: deque[int] = deque()  # drawn by ``known`` after ``_peeked`` (which is then set), not consumed

    def peek(self) -> int:
        """The next token, without consuming it."""
        if self._peeked is None:
            if self._pos < len(self._scripted):
                self._peeked = self._scripted[self._pos]
                self._pos += 1
            else:
                self._peeked = self._filler.next()
        return self._peeked

    def pop(self) -> int:
        token = self.peek()
        self._peeked = self._ahead.popleft() if self._ahead else None
        return token

    def take(self, count: int) -> list[int]:
        """The next ``count`` tokens, consumed (``pop`` ``count`` times)."""
        out: list[int] = []
        if count > 0 and self._peeked is not None:
            out.append(self._peeked)
            self._peeked = None
            if self._ahead:
                ahead = self._ahead
                out.extend(ahead.popleft() for _ in range(min(count - 1, len(ahead))))
                if ahead:
                    self._peeked = ahead.popleft()
        if len(out) < count:
            out.extend(self._draw(count - len(out)))
        return out

    def known(self, count: int) -> list[int]:
        """The next ``count`` tokens, not consumed: what ``take(count)`` would return."""
        if count <= 0:
            return []
        first = self.peek()
        if len(self._ahead) < count - 1:
            self._ahead.extend(self._draw(count - 1 - len(self._ahead)))
        return [first, *islice(self._ahead, count - 1)]

    def _draw(self, count: int) -> list[int]:
        """The next ``count`` tokens from the script, then the filler (nothing drawn before them is pending)."""
        out = self._scripted[self._pos : self._pos + count]
        self._pos += len(out)
        if len(out) < count:
            out.extend(self._filler.take(count - len(out)))
        return out
