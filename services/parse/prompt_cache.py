"""Incremental prompt tokenization per session: a turn costs its new text, not the whole session.

An agent's turn N+1 renders to turn N's text plus a little: the previous turn's output and the new
messages. Re-tokenizing the whole text every turn (~100k tokens late in a session) is the dominant
cost of building the prompt, so ``PromptCache`` keeps, per session, the previous render's text, its
token ids, and the *boundaries* in it: where a boundary token (an added token, e.g. ``<|im_start|>``)
starts, as a character offset and a token index. For the new render it finds the longest common
prefix with the previous text, backs off to the last boundary whose token lies wholly inside that
prefix, keeps the previous ids up to it and tokenizes only the rest.

Why that is exact: a tokenizer splits added tokens out of the text before anything else runs, and
normalizes, pre-tokenizes and BPE-merges each piece between them on its own, so
``encode(text) == encode(text[:b]) + encode(text[b:])`` wherever an added token starts at ``b``, and
``encode(text[:b])`` depends on ``text[:b]`` only — provided nothing else matches across ``b``.
``boundary_tokens`` admits only tokens for which that holds: no ``lstrip`` (it would take the
whitespace before it), no ``single_word``, not normalized, and no added token that is longer with the
same start or that overlaps its start from the left (such a token could match across ``b`` when the
text after ``b`` changes). Each admitted token is also checked on probe texts. The property test in
``tests/parse/test_prompt_cache.py`` holds incremental ids == full ids over every template family.

The chat template still renders the whole conversation each turn: the template decides the text
(it may look at the whole history: the last user turn, ``loop.last``) and no template-independent
way exists to prove a partial render equal; rendering costs ~10 ms at 100k tokens, tokenizing with
``tokenizers`` ~150-300 ms (see ``bench/prompt_build.py``).

Keys are the caller's (the service passes ``prefix_watch.session_key``: session + trajectory; an
empty key — an anonymous identity — is never cached). Tools and template kwargs are not part of the
key: they change the text, and the common-prefix search handles any change of text exactly. A key
holds up to ``lines_per_key`` renders (sub-agents and side calls under one session); a render
reuses the line it shares the longest prefix with. The cache is bounded by keys and by total tokens
(least recently used keys go first) and is safe to call from several threads.
"""

from __future__ import annotations

import bisect
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy
from tokenizers import Tokenizer

from services.common.sequences import common_prefix

Build = Literal["incremental", "full"]
# Why a build was what it was. incremental: "extends" (the new text diverges after the previous render's
# last boundary: the normal agent turn), "rewritten" (it diverges earlier: the prefix up to there is reused).
# full: "anonymous" (no key), "new_key" (first turn of the key, or it was evicted), "rewritten" (the text
# diverges before the first boundary: a changed system prompt, a billing line), "disabled" (no boundary tokens).
Reason = Literal["extends", "rewritten", "anonymous", "new_key", "disabled"]


@dataclass(frozen=True)
class Encoded:
    """Token ids of a text, and how they were obtained. ``token_ids`` is an ``array('I')`` when it came from a
    session's render (shared with the cache: never mutate it); arrays slice, compare and pack as one C call."""

    token_ids: Sequence[int]
    build: Build
    reason: Reason
    reused_tokens: int  # ids taken from the session's previous render


@dataclass(frozen=True)
class _Render:
    text: str
    ids: array[int]  # never mutated (shared with the Encoded it was returned in)
    ends: list[int]  # char offset where each boundary token ends (ascending)
    starts: list[int]  # char offset where it starts
    index: list[int]  # token index of it


@dataclass(frozen=True)
class Reuse:
    """What :meth:`PromptCache.encode_reusing` does with ``text``: reuse ``prev``'s ids up to its boundary ``at`` and
    tokenize the rest, or (``prev`` None) tokenize it all: ``at`` is then 1 when the key's renders share nothing
    before a boundary with ``text``, else 0."""

    key: str
    text: str
    prev: _Render | None
    at: int

    @property
    def new_chars(self) -> int:
        """How many characters of ``text`` are tokenized."""
        return len(self.text) - self.prev.starts[self.at] if self.prev is not None else len(self.text)


def boundary_tokens(tokenizer: Tokenizer, encode: Callable[[str], list[int]] | None = None) -> dict[int, str]:
    """Added tokens at whose start a text can be cut and tokenized in two (see module docstring), by id.

    ``encode`` (default: ``tokenizer`` without special tokens) is the encoder the cache will use; each
    candidate is checked with it on probe texts too.
    """
    def reference(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    enc = encode or reference
    added = {i: t for i, t in tokenizer.get_added_tokens_decoder().items() if t.content}
    out: dict[int, str] = {}
    for token_id, token in added.items():
        t = token.content
        if token.lstrip or token.single_word or token.normalized:
            continue
        if any(_overlaps_start(u.content, t, same=u_id == token_id) for u_id, u in added.items()):
            continue
        if all(_splits(enc, reference, left, t + right)
               for left in ("", "a b", "x ", " \n", "é1", "<|") for right in ("", "\n", " y", "y", "  \n")):
            out[token_id] = t
    return out


def _overlaps_start(u: str, t: str, *, same: bool) -> bool:
    """Could ``u`` match across the start of ``t``: ``u`` longer with ``t`` as its start, or a suffix of ``u``
    (not all of it) overlapping ``t``'s beginning."""
    if not same and len(u) > len(t) and u.startswith(t):
        return True
    return any(t.startswith(u[i:]) or u[i:].startswith(t) for i in range(1, len(u)))


def _splits(enc: Callable[[str], list[int]], ref: Callable[[str], list[int]], left: str, right: str) -> bool:
    whole = ref(left + right)
    return enc(left) + enc(right) == whole and enc(left + right) == whole


def positions_of(ids: array[int], wanted: numpy.ndarray[Any, Any]) -> list[int]:
    """The indexes in ``ids`` of the values in ``wanted``, in order: one vectorised pass (a Python pass over a
    100k-token prompt's ids took ~5 ms, a third of a full build)."""
    found = numpy.flatnonzero(numpy.isin(numpy.frombuffer(ids, dtype=f"u{ids.itemsize}"), wanted))
    return found.tolist()  # type: ignore[no-any-return]


class PromptCache:
    """Per-key previous render + ids; ``encode(key, text)`` tokenizes only what changed (thread-safe)."""

    def __init__(
        self,
        encode: Callable[[str], list[int]],
        boundaries: dict[int, str],
        *,
        max_keys: int = 1024,
        max_tokens: int = 4_000_000,
        lines_per_key: int = 4,
    ) -> None:
        self._encode = encode
        self._boundary_ids = numpy.array(sorted(boundaries), dtype=numpy.uint32)
        alternatives = sorted(set(boundaries.values()), key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, alternatives))) if alternatives else None
        self._max_keys = max_keys
        self._max_tokens = max_tokens
        self._lines = lines_per_key
        self._keys: OrderedDict[str, list[_Render]] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()

    @property
    def cached_tokens(self) -> int:
        return self._tokens

    def encode(self, key: str, text: str) -> Encoded:
        """``text``'s ids, equal to a full encode; reuses the key's previous render where it can."""
        return self.encode_reusing(self.reuse(key, text))

    def new_chars(self, key: str, text: str) -> int:
        """How many characters of ``text`` :meth:`encode` would tokenize now (the rest reuses the key's ids)."""
        return self.reuse(key, text).new_chars

    def reuse(self, key: str, text: str) -> Reuse:
        """What :meth:`encode` of ``text`` would reuse of the key's renders now (decided once: a caller may look at
        it, then encode with it, in another thread too)."""
        if not key or self._pattern is None:
            return Reuse(key, text, None, 0)
        prev, at = self._reusable(key, text)
        return Reuse(key, text, prev, at)

    def encode_reusing(self, reuse: Reuse) -> Encoded:
        """:meth:`encode` as ``reuse`` (from :meth:`reuse`) decided. The render it reuses may have left the cache
        since: its ids still hold, and the new render is stored all the same."""
        key, text, prev, at = reuse.key, reuse.text, reuse.prev, reuse.at
        if not key or self._pattern is None:
            return Encoded(self._encode(text), "full", "anonymous" if not key else "disabled", 0)
        if prev is None:
            render = self._full(text)
            self._store(key, None, render)
            return Encoded(render.ids, "full", "rewritten" if at else "new_key", 0)
        render = self._extend(prev, at, text)
        self._store(key, prev, render)
        reason: Reason = "extends" if at == len(prev.ends) - 1 else "rewritten"
        return Encoded(render.ids, "incremental", reason, prev.index[at])

    def _reusable(self, key: str, text: str) -> tuple[_Render | None, int]:
        """The key's render that ``text`` reuses and the index of the boundary it reuses it up to; ``(None, 0)``
        when the key holds none, ``(None, 1)`` when none shares anything before a boundary with ``text``."""
        with self._lock:
            lines = list(self._keys.get(key, ()))
        if not lines:
            return None, 0
        best, best_at = -1, -1
        for i, line in enumerate(lines):
            at = _last_boundary(line, common_prefix(line.text, text))
            if at > best_at:
                best, best_at = i, at
        if best_at < 0 or lines[best].index[best_at] == 0:  # nothing before the divergence to reuse
            return None, 1
        return lines[best], best_at

    def _full(self, text: str) -> _Render:
        ids = array("I", self._encode(text))
        starts, ends, index = self._boundaries(text, ids, 0, 0)
        return _Render(text, ids, ends, starts, index)

    def _extend(self, prev: _Render, at: int, text: str) -> _Render:
        cut, keep = prev.starts[at], prev.index[at]
        tail = array("I", self._encode(text[cut:]))
        starts, ends, index = self._boundaries(text[cut:], tail, cut, keep)
        ids = prev.ids[:keep]  # a memcpy, where a list of 100k ids took ~0.5 ms
        ids.extend(tail)
        return _Render(text, ids, prev.ends[:at] + ends, prev.starts[:at] + starts, prev.index[:at] + index)

    def _boundaries(
        self, text: str, ids: array[int], char0: int, token0: int
    ) -> tuple[list[int], list[int], list[int]]:
        """Char starts, char ends and token indexes of the boundary tokens in ``text`` (shifted by ``char0`` /
        ``token0``). The k-th match in the text is the k-th boundary id in the ids (module docstring); were
        the counts ever to differ, no boundary is recorded (later turns rebuild more, never wrongly)."""
        assert self._pattern is not None
        matches = [(m.start() + char0, m.end() + char0) for m in self._pattern.finditer(text)]
        index = [i + token0 for i in positions_of(ids, self._boundary_ids)]
        if len(matches) != len(index):
            return [], [], []
        return [s for s, _ in matches], [e for _, e in matches], index

    def _store(self, key: str, replaced: _Render | None, render: _Render) -> None:
        with self._lock:
            lines = self._keys.pop(key, [])
            if replaced is not None and replaced in lines:
                lines.remove(replaced)
                self._tokens -= len(replaced.ids)
            lines.append(render)
            self._tokens += len(render.ids)
            while len(lines) > self._lines:
                self._tokens -= len(lines.pop(0).ids)
            self._keys[key] = lines
            while self._keys and (len(self._keys) > self._max_keys or self._tokens > self._max_tokens):
                _, dropped = self._keys.popitem(last=False)
                self._tokens -= sum(len(r.ids) for r in dropped)


def _last_boundary(render: _Render, shared: int) -> int:
    """Index of the last boundary whose token lies wholly within the first ``shared`` chars (-1: none)."""
    return bisect.bisect_right(render.ends, shared) - 1
