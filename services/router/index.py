"""The KV index: which worker holds which prefix block, built from the workers' KV events.

Keys are chained block hashes (see ``services.common.block_hash``): a block's hash names its whole
prefix, so each worker is one set of hashes, and matching a request walks its block hashes in order per
candidate, stopping at the first block that candidate lacks — O(matched blocks) per candidate, at C
speed, independent of how many blocks the index holds. Events are set updates in bulk.

Event ids are consecutive per worker. A worker's state is *synced* while every id has been applied in
order. An id that skips ahead (a lost NATS message) makes :meth:`KvIndex.apply` return True: the
worker is now *recovering*, later events are held back, and the caller repairs the gap with
:meth:`apply_replay` (the missing range, from the worker's ring buffer) or :meth:`apply_dump` (its whole
block set). Held-back events newer than the repair are then applied in order. A worker whose first
event seen has id 1 needs no repair; one first seen mid-stream does.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import takewhile


@dataclass(frozen=True)
class StoredEvent:
    """Blocks now held by a worker (each the child of the one before)."""

    event_id: int
    block_hashes: tuple[int, ...]


@dataclass(frozen=True)
class RemovedEvent:
    """Blocks a worker evicted."""

    event_id: int
    block_hashes: tuple[int, ...]


@dataclass(frozen=True)
class ClearedEvent:
    """A worker dropped its whole cache."""

    event_id: int


KvEvent = StoredEvent | RemovedEvent | ClearedEvent


@dataclass
class _WorkerState:
    blocks: set[int] = field(default_factory=set)
    last_event_id: int = 0
    synced: bool = False
    pending: list[KvEvent] = field(default_factory=list)


class KvIndex:
    """Each worker's block set (block hashes) and event position."""

    def __init__(self) -> None:
        self._workers: dict[str, _WorkerState] = {}
        self.gaps_seen = 0
        self.events_applied = 0

    # -- events ---------------------------------------------------------------------------------

    def apply(self, worker_id: str, events: Iterable[KvEvent]) -> bool:
        """Apply one worker's events in order; True when a gap was found and the worker needs repair."""
        state = self._workers.get(worker_id)
        if state is None:
            state = self._workers[worker_id] = _WorkerState()
        if not state.synced:
            state.pending.extend(events)
            if state.last_event_id == 0 and state.pending and state.pending[0].event_id == 1:
                state.synced = True  # seen from its very first event: nothing to repair
                return self._drain(worker_id, state)
            return bool(state.pending)
        return self._apply_in_order(worker_id, state, list(events))

    def begin_recovery(self, worker_id: str) -> None:
        """Hold this worker's events back until a replay or dump repairs it."""
        state = self._workers.setdefault(worker_id, _WorkerState())
        state.synced = False

    def apply_replay(self, worker_id: str, events: Sequence[KvEvent]) -> bool:
        """Events fetched from the worker after a gap; True if a gap remains (ask for a dump)."""
        state = self._workers.setdefault(worker_id, _WorkerState())
        state.pending = sorted([*events, *state.pending], key=lambda e: e.event_id)
        state.synced = True
        return self._drain(worker_id, state)

    def apply_dump(self, worker_id: str, last_event_id: int, block_hashes: Iterable[int]) -> bool:
        """Replace the worker's block set with a dump taken at ``last_event_id``; True if a gap remains."""
        state = self._workers.setdefault(worker_id, _WorkerState())
        state.blocks = set(block_hashes)
        state.last_event_id = last_event_id
        state.synced = True
        return self._drain(worker_id, state)

    def _drain(self, worker_id: str, state: _WorkerState) -> bool:
        pending, state.pending = state.pending, []
        return self._apply_in_order(worker_id, state, pending)

    def _apply_in_order(self, worker_id: str, state: _WorkerState, events: list[KvEvent]) -> bool:
        for i, event in enumerate(events):
            if event.event_id <= state.last_event_id:
                continue  # duplicate, or already covered by a dump
            if event.event_id != state.last_event_id + 1:
                self.gaps_seen += 1
                state.synced = False
                state.pending = events[i:]
                return True
            state.last_event_id = event.event_id
            self.events_applied += 1
            if isinstance(event, StoredEvent):
                state.blocks.update(event.block_hashes)
            elif isinstance(event, RemovedEvent):
                state.blocks.difference_update(event.block_hashes)
            else:
                state.blocks = set()
        return False

    def remove_worker(self, worker_id: str) -> None:
        self._workers.pop(worker_id, None)

    # -- queries --------------------------------------------------------------------------------

    def overlaps(self, block_hashes: Sequence[int], candidates: Iterable[str]) -> dict[str, int]:
        """Leading blocks of ``block_hashes`` each candidate holds (0 for none): per candidate, a scan of its
        own block set that stops at the first block it lacks (C-speed, ``takewhile`` over ``__contains__``)."""
        workers = self._workers
        result: dict[str, int] = {}
        for worker in candidates:
            state = workers.get(worker)
            result[worker] = 0 if state is None else len(list(takewhile(state.blocks.__contains__, block_hashes)))
        return result

    def block_count(self, worker_id: str) -> int:
        state = self._workers.get(worker_id)
        return len(state.blocks) if state is not None else 0

    def holds(self, worker_id: str) -> Container[int]:
        """The worker's live block set, for membership tests only (no copy: do not keep it)."""
        state = self._workers.get(worker_id)
        return state.blocks if state is not None else frozenset()

    def blocks(self, worker_id: str) -> frozenset[int]:
        state = self._workers.get(worker_id)
        return frozenset(state.blocks) if state is not None else frozenset()

    def last_event_id(self, worker_id: str) -> int | None:
        state = self._workers.get(worker_id)
        return state.last_event_id if state is not None else None

    def is_synced(self, worker_id: str) -> bool:
        state = self._workers.get(worker_id)
        return state is not None and state.synced

    def is_behind(self, worker_id: str, published_last_event_id: int) -> bool:
        """True when a synced worker has published events this index never received (a lost tail)."""
        state = self._workers.get(worker_id)
        if state is None:
            return published_last_event_id > 0
        return state.synced and state.last_event_id < published_last_event_id

    def workers(self) -> list[str]:
        return sorted(self._workers)
