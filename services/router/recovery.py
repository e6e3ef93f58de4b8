"""Repairs the KV index when a worker's event stream has a gap, or when the router (re)starts.

The transport is behind :class:`RecoverySource` (gRPC to the worker's ``KvRecovery`` service in the
router process, a fake in tests), so this stays free of gRPC. One repair runs per worker at a time;
asking again while one runs is a no-op (the running repair drains everything held back).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from services.router.index import KvEvent, KvIndex
from services.router.registry import WorkerEndpoint, WorkerRegistry

log = structlog.get_logger()


@dataclass(frozen=True)
class Dump:
    """A worker's whole cached block set as of ``last_event_id``; ``parents``: each block's parent, parallel
    to ``block_hashes`` (None: a first block), when the worker sent them (the index then keeps its chains)."""

    last_event_id: int
    block_hashes: Sequence[int]
    parents: Sequence[int | None] | None = None


class RecoverySource(Protocol):
    """How to ask a worker for its events or its whole block set."""

    async def replay(self, endpoint: WorkerEndpoint, from_event_id: int) -> Sequence[KvEvent] | None:
        """Events from ``from_event_id`` to the newest; None when the worker's buffer no longer has them."""
        ...

    async def dump(self, endpoint: WorkerEndpoint) -> Dump:
        """The worker's whole cached block set."""
        ...


class KvRecoverer:
    """Runs replays and dumps against workers and applies them to the index (see module docstring)."""

    def __init__(self, index: KvIndex, registry: WorkerRegistry, source: RecoverySource, attempts: int = 3) -> None:
        self._index = index
        self._registry = registry
        self._source = source
        self._attempts = attempts
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.replays = 0
        self.dumps = 0

    def repair(self, worker_id: str, *, dump: bool = False) -> None:
        """Repair ``worker_id`` in the background (a dump when asked, else a replay first)."""
        if worker_id in self._tasks:
            return
        self._index.begin_recovery(worker_id)
        task = asyncio.create_task(self._run(worker_id, dump), name=f"kv-recovery-{worker_id}")
        self._tasks[worker_id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(worker_id, None))

    def busy(self) -> bool:
        return bool(self._tasks)

    async def wait_idle(self) -> None:
        while self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        for task in list(self._tasks.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    async def _run(self, worker_id: str, dump: bool) -> None:
        for _attempt in range(self._attempts):
            endpoint = self._registry.get(worker_id)
            if endpoint is None:
                return  # not (or no longer) a live worker: its events wait for its first heartbeat
            try:
                if not dump:
                    last = self._index.last_event_id(worker_id) or 0
                    events = await self._source.replay(endpoint, last + 1)
                    if events is not None:
                        self.replays += 1
                        if not self._index.apply_replay(worker_id, events):
                            log.info("router.kv_replayed", worker_id=worker_id, from_event_id=last + 1,
                                     events=len(events))
                            return
                        continue  # still a gap (events lost again meanwhile): replay again
                dumped = await self._source.dump(endpoint)
                self.dumps += 1
                if not self._index.apply_dump(worker_id, dumped.last_event_id, dumped.block_hashes,
                                              dumped.parents):
                    log.info("router.kv_dumped", worker_id=worker_id, last_event_id=dumped.last_event_id,
                             blocks=len(dumped.block_hashes))
                    return
                dump = False
            except Exception as exc:  # worker unreachable: its heartbeat expiry will remove it
                log.warning("router.kv_recovery_failed", worker_id=worker_id, error=str(exc))
                await asyncio.sleep(0.2)
        log.warning("router.kv_recovery_gave_up", worker_id=worker_id)
