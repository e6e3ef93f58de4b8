"""Live workers, learned from their NATS heartbeats, and the router's own load book-keeping."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class WorkerEndpoint:
    """A worker as its heartbeat describes it."""

    worker_id: str
    address: str
    block_size: int
    total_blocks: int
    model: str = ""
    engine: str = ""
    shortest_prefill_first: bool = False  # its engine serves prompts with the fewest tokens left first


@dataclass
class WorkerLoad:
    """Requests this router has in flight on one worker, and the KV blocks they occupy."""

    requests: int = 0
    active_blocks: int = 0
    prefill_blocks: int = 0
    prefills: dict[int, int] = field(default_factory=dict)  # prefill size in blocks -> requests prefilling that many

    def prefill_ahead(self, new_blocks: int) -> int:
        """Prefill blocks in flight that a prompt with ``new_blocks`` to compute waits for, when the worker gives
        its step budget to the prompts with the fewest tokens left first (``--prefill-order shortest``): each
        request in flight delays it by its own size, or by ``new_blocks`` when it is larger (the two share
        steps until the new one is done)."""
        if not self.prefills:
            return 0
        return sum((size if size < new_blocks else new_blocks) * n for size, n in self.prefills.items())

    def add_prefill(self, blocks: int) -> None:
        self.prefill_blocks += blocks
        if blocks > 0:
            self.prefills[blocks] = self.prefills.get(blocks, 0) + 1

    def end_prefill(self, blocks: int) -> None:
        self.prefill_blocks -= blocks
        if blocks > 0:
            n = self.prefills.pop(blocks)
            if n > 1:
                self.prefills[blocks] = n - 1


@dataclass
class _Entry:
    endpoint: WorkerEndpoint
    last_seen: float
    load: WorkerLoad = field(default_factory=WorkerLoad)


class WorkerRegistry:
    """Workers seen recently; each forgotten after ``timeout`` seconds of silence or on ``leaving``."""

    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._timeout = timeout
        self._clock = clock
        self._entries: dict[str, _Entry] = {}

    def heartbeat(self, endpoint: WorkerEndpoint) -> bool:
        """Record a heartbeat; True if the worker is new (or changed address)."""
        entry = self._entries.get(endpoint.worker_id)
        now = self._clock()
        if entry is None or entry.endpoint != endpoint:
            load = entry.load if entry is not None else WorkerLoad()
            self._entries[endpoint.worker_id] = _Entry(endpoint, now, load)
            return True
        entry.last_seen = now
        return False

    def remove(self, worker_id: str) -> WorkerEndpoint | None:
        entry = self._entries.pop(worker_id, None)
        return entry.endpoint if entry is not None else None

    def overdue(self, fraction: float = 1.0) -> list[WorkerEndpoint]:
        """Workers not seen for ``fraction`` of the timeout (still registered)."""
        cutoff = self._clock() - self._timeout * fraction
        return [e.endpoint for e in self._entries.values() if e.last_seen < cutoff]

    def touch(self, worker_id: str) -> None:
        """Count the worker as seen now (it answered another way than a heartbeat)."""
        entry = self._entries.get(worker_id)
        if entry is not None:
            entry.last_seen = self._clock()

    def expire(self) -> list[WorkerEndpoint]:
        """Forget workers silent for longer than the timeout; return them."""
        cutoff = self._clock() - self._timeout
        gone = [wid for wid, e in self._entries.items() if e.last_seen < cutoff]
        return [self._entries.pop(wid).endpoint for wid in gone]

    def get(self, worker_id: str) -> WorkerEndpoint | None:
        entry = self._entries.get(worker_id)
        return entry.endpoint if entry is not None else None

    def endpoints(self) -> list[WorkerEndpoint]:
        return [e.endpoint for e in sorted(self._entries.values(), key=lambda e: e.endpoint.worker_id)]

    def load(self, worker_id: str) -> WorkerLoad:
        entry = self._entries.get(worker_id)
        return entry.load if entry is not None else WorkerLoad()

    def __len__(self) -> int:
        return len(self._entries)
