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
from dataclasses import dataclass
from pathlib import Path

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
        self._pad(out)
        return out

    def _pad(self, out: list[int]) -> None:
        """Should the hash ids cover less than ``input_length``: the tail keyed by them (see :meth:`tokens`)."""
        if len(out) < self.input_length:
            start = zlib.crc32(array("Q", self.hash_ids).tobytes())
            out.extend(TOKEN_SPACE + (start + i) % TOKEN_SPACE for i in range(self.input_length - len(out)))


def _block_range(h: int, trace_block: int, most: int) -> range:
    if not 0 <= h < TOKEN_SPACE // trace_block:
        raise ValueError(f"hash id {h} out of range 0..{TOKEN_SPACE // trace_block - 1}")
    return range(h * trace_block, h * trace_block + min(trace_block, most))


class TracePrompts:
    """Each request's :meth:`TraceRequest.tokens` and their block hashes, built from per-hash-id pieces.

    Requests of one session repeat most of each other's hash ids, so a full trace block's tokens (one tuple
    whose ints every prompt holding it shares) and its sub-blocks' chained hashes, keyed by (parent block's
    hash, hash id), are made once and reused (least recently used dropped past ``max_blocks``). Results equal
    ``tokens()`` and ``sequence_hashes(tokens, block_size)``; a ``block_size`` that does not divide the trace
    block hashes the whole prompt instead.
    """

    def __init__(self, block_size: int, trace_block: int = TRACE_BLOCK, max_blocks: int = 4096) -> None:
        self.block_size = block_size
        self.trace_block = trace_block
        self.max_blocks = max_blocks
        self._tokens: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        self._hashes: OrderedDict[tuple[int | None, int], tuple[int, ...]] = OrderedDict()

    def prompt(self, req: TraceRequest) -> tuple[list[int], list[int]]:
        """(tokens, chained block hashes at ``block_size``) of ``req``'s prompt."""
        tb, bs = self.trace_block, self.block_size
        if tb % bs:
            tokens = req.tokens(tb)
            return tokens, chain_hashes(None, tokens, bs, SEED)
        out: list[int] = []
        hashes: list[int] = []
        n = req.input_length
        for h in req.hash_ids:
            if len(out) + tb > n:
                break
            block = self._block(h)
            parent = hashes[-1] if hashes else None
            key = (parent, h)
            sub = self._hashes.get(key)
            if sub is None:
                sub = self._hashes[key] = tuple(chain_hashes(parent, block, bs, SEED))
                if len(self._hashes) > 16 * self.max_blocks:
                    self._hashes.popitem(last=False)
            else:
                self._hashes.move_to_end(key)
            out.extend(block)
            hashes.extend(sub)
        if len(out) < n:  # the last, cut block and any tail: as tokens() makes them
            start = len(out)
            for h in req.hash_ids[start // tb :]:
                if len(out) >= n:
                    break
                out.extend(_block_range(h, tb, n - len(out)))
            req._pad(out)
            rest = chain_hashes(hashes[-1] if hashes else None, out[start:], bs, SEED)
            hashes.extend(rest)
        return out, hashes

    def _block(self, h: int) -> tuple[int, ...]:
        block = self._tokens.get(h)
        if block is None:
            block = self._tokens[h] = tuple(_block_range(h, self.trace_block, self.trace_block))
            if len(self._tokens) > self.max_blocks:
                self._tokens.popitem(last=False)
        else:
            self._tokens.move_to_end(h)
        return block


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
                                        int(obj["output_length"]), tuple(int(h) for h in obj["hash_ids"])))
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
