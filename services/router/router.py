"""The router's domain core: the KV index, the live workers, and placement decisions."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from services.common.block_hash import sequence_hashes
from services.router.index import KvEvent, KvIndex
from services.router.policy import Candidate, PlacementPolicy, blocks_for
from services.router.registry import WorkerEndpoint, WorkerRegistry


@dataclass(frozen=True)
class Placement:
    """Workers ranked best-first for one request."""

    candidates: list[Candidate]
    request_blocks: int


class Router:
    """Keeps the KV index current and ranks workers for each request."""

    def __init__(self, index: KvIndex, registry: WorkerRegistry, policy: PlacementPolicy) -> None:
        self.index = index
        self.registry = registry
        self.policy = policy

    def on_kv_events(self, worker_id: str, events: Sequence[KvEvent]) -> None:
        self.index.apply(worker_id, events)

    def on_heartbeat(self, endpoint: WorkerEndpoint) -> bool:
        return self.registry.heartbeat(endpoint)

    def forget(self, worker_id: str) -> WorkerEndpoint | None:
        self.index.remove_worker(worker_id)
        return self.registry.remove(worker_id)

    def expire(self) -> list[WorkerEndpoint]:
        gone = self.registry.expire()
        for ep in gone:
            self.index.remove_worker(ep.worker_id)
        return gone

    def place(self, token_ids: Sequence[int], cache_salt: str = "", exclude: frozenset[str] = frozenset()) -> Placement:
        """Rank every live worker for a prompt."""
        endpoints = [ep for ep in self.registry.endpoints() if ep.worker_id not in exclude]
        if not endpoints:
            return Placement([], 0)
        overlaps: dict[str, int] = {}
        request_blocks = 0
        for block_size in sorted({ep.block_size for ep in endpoints}):
            group = [ep.worker_id for ep in endpoints if ep.block_size == block_size]
            hashes = sequence_hashes(token_ids, block_size, cache_salt)
            overlaps.update(self.index.overlaps(hashes, group))
            request_blocks = max(request_blocks, blocks_for(len(token_ids), block_size))
        loads = {wid: self.registry.load(wid) for wid in overlaps}
        return Placement(self.policy.rank(request_blocks, overlaps, loads), request_blocks)

    @contextlib.contextmanager
    def in_flight(self, worker_id: str, blocks: int, new_blocks: int) -> Iterator[None]:
        """Count a request against a worker's load while it runs there."""
        load = self.registry.load(worker_id)
        load.requests += 1
        load.active_blocks += blocks
        load.prefill_blocks += new_blocks
        try:
            yield
        finally:
            load.requests -= 1
            load.active_blocks -= blocks
            load.prefill_blocks -= new_blocks
