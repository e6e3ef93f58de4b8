"""The KV index: which worker holds which prefix block, built from the workers' KV events.

Keys are chained block hashes (see ``services.common.block_hash``): a block's hash names its whole
prefix, so matching a request walks its block hashes in order and stops at the first block no
candidate holds — O(matched blocks), independent of how many blocks the index holds.

Event ids are consecutive per worker. A worker's state is *synced* while every id has been applied in
order. An id that skips ahead (a lost NATS message) makes :meth:`KvIndex.apply` return True: the
worker is now *recovering*, later events are held back, and the caller repairs the gap with
:meth:`apply_replay` (the missing range, from the worker's ring buffer) or :meth:`apply_dump` (its whole
block set). Held-back events newer than the repair are then applied in order. A worker whose first
event seen has id 1 needs no repair; one first seen mid-stream does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import cast


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
    """Block hash -> workers holding it, plus each worker's own block set and event position."""

    def __init__(self) -> None:
        self._holders: dict[int, set[str]] = {}
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
        for block in state.blocks:
            self._unhold(worker_id, block)
        state.blocks = set(block_hashes)
        for block in state.blocks:
            self._holders.setdefault(block, set()).add(worker_id)
        state.last_event_id = last_event_id
        state.synced = True
        return self._drain(worker_id, state)

    def _drain(self, worker_id: str, state: _WorkerState) -> bool:
        pending, state.pending = state.pending, []
        return self._apply_in_order(worker_id, state, pending)

    def _apply_in_order(self, worker_id: str, state: _WorkerState, events: list[KvEvent]) -> bool:
        holders = self._holders
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
                hashes = event.block_hashes
                state.blocks.update(hashes)
                if not any(map(holders.__contains__, hashes)):  # the usual case: new to the whole index
                    holders.update(zip(hashes, map(set, repeat((worker_id,))), strict=False))  # one set each, in C
                    continue
                for block in hashes:
                    held = holders.get(block)
                    if held is None:
                        holders[block] = {worker_id}
                    else:
                        held.add(worker_id)
            elif isinstance(event, RemovedEvent):
                blocks = state.blocks
                present = list(filter(blocks.__contains__, event.block_hashes))
                blocks.difference_update(present)
                sets = list(map(holders.get, present))
                if None not in sets and list(map(len, cast(list[set[str]], sets))).count(1) == len(sets):
                    # every one held by this worker alone: drop them all (C-speed)
                    deque(map(holders.__delitem__, present), maxlen=0)
                    continue
                for block, held in zip(present, sets, strict=True):
                    if held is not None:
                        held.discard(worker_id)
                        if not held:
                            del holders[block]
            else:
                for block in state.blocks:
                    self._unhold(worker_id, block)
                state.blocks = set()
        return False

    def _unhold(self, worker_id: str, block: int) -> None:
        holders = self._holders.get(block)
        if holders is not None:
            holders.discard(worker_id)
            if not holders:
                del self._holders[block]

    def remove_worker(self, worker_id: str) -> None:
        state = self._workers.pop(worker_id, None)
        if state is not None:
            for block in state.blocks:
                self._unhold(worker_id, block)

    # -- queries --------------------------------------------------------------------------------

    def overlaps(self, block_hashes: Sequence[int], candidates: Iterable[str]) -> dict[str, int]:
        """Leading blocks of ``block_hashes`` each candidate holds (0 for none)."""
        result = dict.fromkeys(candidates, 0)
        active = set(result)
        holders_of = self._holders
        depth = 0
        for block in block_hashes:
            holders = holders_of.get(block)
            if not holders:
                break
            if not active <= holders:
                narrowed = active & holders
                for worker in active - narrowed:
                    result[worker] = depth
                active = narrowed
                if not active:
                    break
            depth += 1
        for worker in active:
            result[worker] = depth
        return result

    def block_count(self, worker_id: str) -> int:
        state = self._workers.get(worker_id)
        return len(state.blocks) if state is not None else 0

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
