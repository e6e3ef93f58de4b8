"""Placement: which worker should run a request, given prefix overlaps and load.

``kv`` mode scores each worker by ``overlap_weight * new_prefill_blocks + active_blocks`` — the
blocks it would have to prefill for this request plus the KV it already has in use for requests in
flight — and picks the lowest; ties go to the worker with fewer requests in flight. The other modes
exist so benchmarks compare like with like.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.router.registry import WorkerLoad


@dataclass(frozen=True)
class Candidate:
    """One worker's standing for one request."""

    worker_id: str
    overlap_blocks: int
    new_blocks: int
    cost: float


class PlacementPolicy:
    """Orders candidate workers best-first for one request (the rest are retry fallbacks)."""

    def __init__(self, mode: str, overlap_weight: float, rng: random.Random | None = None) -> None:
        self.mode = mode
        self.overlap_weight = overlap_weight
        self._rng = rng or random.Random()
        self._next = 0

    def rank(
        self,
        request_blocks: int,
        overlaps: Mapping[str, int],
        loads: Mapping[str, WorkerLoad],
    ) -> list[Candidate]:
        workers = sorted(overlaps)
        candidates = []
        for wid in workers:
            overlap = overlaps[wid]
            new = max(request_blocks - overlap, 0)
            cost = self.overlap_weight * new + loads[wid].active_blocks
            candidates.append(Candidate(wid, overlap, new, cost))
        if not candidates:
            return []
        if self.mode == "kv":
            return sorted(candidates, key=lambda c: (c.cost, loads[c.worker_id].requests, c.worker_id))
        if self.mode == "least-loaded":
            return sorted(candidates, key=lambda c: (loads[c.worker_id].requests, c.worker_id))
        if self.mode == "round-robin":
            start = self._next % len(candidates)
            self._next += 1
            return candidates[start:] + candidates[:start]
        if self.mode == "random":
            shuffled = list(candidates)
            self._rng.shuffle(shuffled)
            return shuffled
        raise ValueError(f"unknown routing mode {self.mode!r}")


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def describe(candidates: Sequence[Candidate]) -> list[dict[str, object]]:
    """Candidates as log/span-friendly dicts."""
    return [
        {"worker": c.worker_id, "overlap_blocks": c.overlap_blocks, "new_blocks": c.new_blocks, "cost": c.cost}
        for c in candidates
    ]
