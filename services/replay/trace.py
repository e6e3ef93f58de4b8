"""Mooncake-format traces: ``{timestamp, input_length, output_length, hash_ids}`` per line.

Each hash id stands for one 512-token block and names its whole prefix, so tokens are synthesised per
hash id (equal ids give equal tokens, different ids never collide) and the last block is cut to
``input_length``. The simulator and the live replay send the same tokens (:meth:`TraceRequest.tokens`).
"""

from __future__ import annotations

import json
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path

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
            if not 0 <= h < TOKEN_SPACE // trace_block:
                raise ValueError(f"hash id {h} out of range 0..{TOKEN_SPACE // trace_block - 1}")
            out.extend(range(h * trace_block, (h + 1) * trace_block))
            if len(out) >= self.input_length:
                break
        if len(out) < self.input_length:
            start = zlib.crc32(array("Q", self.hash_ids).tobytes())
            out.extend(TOKEN_SPACE + (start + i) % TOKEN_SPACE for i in range(self.input_length - len(out)))
        return out[: self.input_length]


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
