"""Mooncake-format traces: ``{timestamp, input_length, output_length, hash_ids}`` per line.

Each hash id stands for one 512-token block and names its whole prefix, so tokens are synthesised per
hash id (equal ids give equal tokens, different ids never collide) and the last block is cut to
``input_length``. The simulator and the live replay send the same tokens (:meth:`TraceRequest.tokens`).
"""

from __future__ import annotations

import json
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import overload

from services.common.block_hash import SEED, chain_hashes

TRACE_BLOCK = 512
TOKEN_SPACE = 1 << 31  # block tokens live below, padding tails above (token ids are uint32)


@dataclass(frozen=True)
class TraceRequest:
    """One line of a trace."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    session: str = ""   # agent traces: the conversation (``parent/agent_id`` for a sub-agent)
    stop: str = ""      # agent traces: how the turn ended (``tool_use``, ``end_turn``)

    def tokens(self, trace_block: int = TRACE_BLOCK) -> list[int]:
        """The synthesised prompt, the same in the simulator and the live replay (valid uint32 token ids).

        Block ``h`` is ``h * trace_block ... h * trace_block + trace_block - 1`` (all below 2**31). Should the
        hash ids cover less than ``input_length``, the rest is a tail from ``[2**31, 2**32)`` keyed by the hash
        ids, so it never equals any block's tokens.
        """
        out: list[int] = []
        for h in self.hash_ids:
            if len(out) >= self.input_length:
                break
            out.extend(_block_range(h, trace_block, self.input_length - len(out)))
        out.extend(self._padding(self.input_length - len(out)))
        return out

    def _padding(self, count: int) -> list[int]:
        """The first ``count`` tokens of the tail keyed by the hash ids, should they cover less than
        ``input_length`` (see :meth:`tokens`)."""
        if count <= 0:
            return []
        start = zlib.crc32(array("Q", self.hash_ids).tobytes())
        return [TOKEN_SPACE + (start + i) % TOKEN_SPACE for i in range(count)]


def _block_range(h: int, trace_block: int, most: int) -> range:
    if not 0 <= h < TOKEN_SPACE // trace_block:
        raise ValueError(f"hash id {h} out of range 0..{TOKEN_SPACE // trace_block - 1}")
    return range(h * trace_block, h * trace_block + min(trace_block, most))


@dataclass(frozen=True)
class _Kept:
    """A kept prompt's whole trace blocks: their hash ids, and the lists of its token pieces and chained block
    hashes, whose first ``len(ids)`` pieces and ``len(ids) * trace_block // block_size`` hashes are theirs (the
    lists are the prompt's own, which grow past them: only ever appended to)."""

    ids: tuple[int, ...]
    pieces: list[Sequence[int]]
    hashes: list[int]


class PromptTokens(Sequence[int]):
    """A synthesised prompt held as its pieces (trace-block ranges, then a tail), never as one list.

    Item for item equal to :meth:`TraceRequest.tokens`; slices are lists. Every piece but the last holds
    ``piece`` tokens. The simulator's engine cores keep it as the start of each request's token stream
    (``CoreRequest(..., share_prompt=True)``), so a 100k-token prompt is never copied whole.
    """

    __slots__ = ("_len", "_piece", "_pieces")

    def __init__(self, pieces: list[Sequence[int]], piece: int, length: int | None = None) -> None:
        """``length``: the pieces' total length, when the caller knows it."""
        self._pieces = pieces
        self._piece = piece
        self._len = sum(map(len, pieces)) if length is None else length

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            if step != 1:
                return list(self)[index]
            return self._slice(start, stop) if start < stop else []
        i = index + self._len if index < 0 else index
        if not 0 <= i < self._len:
            raise IndexError("prompt token index out of range")
        first = self._locate(i)
        return self._pieces[first][i - first * self._piece]

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(self._pieces)

    def _slice(self, start: int, stop: int) -> list[int]:
        """Tokens ``start:stop`` (``start < stop``): whole pieces are extended, the two ends sliced."""
        pieces, piece = self._pieces, self._piece
        first, last = self._locate(start), self._locate(stop - 1)
        head = pieces[first][start - first * piece :]
        if first == last:
            return list(head[: stop - start])
        out = list(head)
        for i in range(first + 1, last):
            out.extend(pieces[i])
        out.extend(pieces[last][: stop - last * piece])
        return out

    def _locate(self, i: int) -> int:
        """The piece holding token ``i`` (the last one holds everything past the others)."""
        return min(i // self._piece, len(self._pieces) - 1)


class TracePrompts:
    """Each request's :meth:`TraceRequest.tokens` and their block hashes, built from per-hash-id pieces.

    Requests of one session repeat most of each other's hash ids. A full trace block's tokens are a ``range``
    (consecutive ids: nothing to build or keep); its sub-blocks' chained hashes, keyed by (parent block's
    hash, hash id), are made once and reused (least recently used dropped past ``16 * max_blocks``). The whole
    trace blocks of the last ``max_prompts`` prompts are kept as well (keyed by their last hash id, checked
    against all their ids): a session's next turn starts from its previous prompt's pieces and hashes. Results
    equal ``tokens()`` and ``sequence_hashes(tokens, block_size)``; a ``block_size`` that does not divide the
    trace block hashes the whole prompt instead.
    """

    def __init__(self, block_size: int, trace_block: int = TRACE_BLOCK, max_blocks: int = 256,
                 max_prompts: int = 1024) -> None:
        self.block_size = block_size
        self.trace_block = trace_block
        self.max_blocks = max_blocks
        self.max_prompts = max_prompts
        self._hashes: OrderedDict[tuple[int | None, int], tuple[int, ...]] = OrderedDict()
        self._prompts: OrderedDict[int, _Kept] = OrderedDict()

    def prompt(self, req: TraceRequest) -> tuple[PromptTokens, list[int]]:
        """(tokens, chained block hashes at ``block_size``) of ``req``'s prompt."""
        tb, bs = self.trace_block, self.block_size
        if tb % bs:
            tokens = req.tokens(tb)
            return PromptTokens([tokens], max(len(tokens), 1)), chain_hashes(None, tokens, bs, SEED)
        n = req.input_length
        pieces, hashes = self._whole_blocks(req.hash_ids[: n // tb])
        start = len(pieces) * tb
        if start < n:  # the last, cut block and any tail: as tokens() makes them
            tail: list[int] = []
            for h in req.hash_ids[len(pieces) :]:
                if start + len(tail) >= n:
                    break
                tail.extend(_block_range(h, tb, n - start - len(tail)))
            tail.extend(req._padding(n - start - len(tail)))
            hashes.extend(chain_hashes(hashes[-1] if hashes else None, tail, bs, SEED))
            pieces.append(tail)
        return PromptTokens(pieces, tb, n), hashes  # (the pieces hold exactly ``n`` tokens)

    def _whole_blocks(self, ids: tuple[int, ...]) -> tuple[list[Sequence[int]], list[int]]:
        """The pieces (block tuples) and chained hashes of the whole trace blocks ``ids``: from the longest kept
        prompt they start with, then block by block; kept in turn for the next prompt."""
        pieces: list[Sequence[int]] = []
        hashes: list[int] = []
        for k in range(len(ids), 0, -1):
            kept = self._prompts.get(ids[k - 1])
            if kept is not None and len(kept.ids) == k and kept.ids == ids[:k]:
                pieces, hashes = kept.pieces[:k], kept.hashes[: k * (self.trace_block // self.block_size)]
                break
        for h in ids[len(pieces) :]:
            self._add_block(h, pieces, hashes)
        if ids:
            self._prompts[ids[-1]] = _Kept(ids, pieces, hashes)
            self._prompts.move_to_end(ids[-1])
            if len(self._prompts) > self.max_prompts:
                self._prompts.popitem(last=False)
        return pieces, hashes

    def _add_block(self, h: int, pieces: list[Sequence[int]], hashes: list[int]) -> None:
        """Append the whole trace block ``h``: its tokens to ``pieces``, its sub-blocks' chained hashes to
        ``hashes``."""
        block = self._block(h)
        parent = hashes[-1] if hashes else None
        key = (parent, h)
        sub = self._hashes.get(key)
        if sub is None:
            sub = self._hashes[key] = tuple(chain_hashes(parent, block, self.block_size, SEED))
            if len(self._hashes) > 16 * self.max_blocks:
                self._hashes.popitem(last=False)
        else:
            self._hashes.move_to_end(key)
        pieces.append(block)
        hashes.extend(sub)

    def _block(self, h: int) -> range:
        return _block_range(h, self.trace_block, self.trace_block)  # a range: no ints are made


def load_trace(path: str | Path, limit: int = 0) -> list[TraceRequest]:
    """Read a JSONL trace (``limit`` > 0: only its first requests), sorted by timestamp."""
    out: list[TraceRequest] = []
    with Path(path).open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                out.append(TraceRequest(float(obj["timestamp"]), int(obj["input_length"]),
                                        int(obj["output_length"]), tuple(map(int, obj["hash_ids"])),
                                        str(obj.get("session", "")), str(obj.get("stop", ""))))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: not a Mooncake trace line ({exc})") from exc
            if limit and len(out) >= limit:
                break
    out.sort(key=lambda r: r.timestamp_ms)
    return out


def ideal_reuse(requests: list[TraceRequest], trace_block: int = TRACE_BLOCK) -> float:
    """Share of prompt blocks seen before (an infinite cache shared by every worker)."""
    seen: set[int] = set()
    hit = total = 0
    for r in requests:
        for h in r.hash_ids:
            total += 1
            if h in seen:
                hit += 1
            seen.add(h)
    return hit / total if total else 0.0
