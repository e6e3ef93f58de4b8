"""The KV index: which worker holds which prefix block, built from the workers' KV events.

Keys are chained block hashes (see ``services.common.block_hash``): a block's hash names its whole
prefix, so each worker is one set of hashes. Events are set updates in bulk.

Matching a request asks, per candidate, how many leading blocks of the prompt it holds. With ``chains``
on (the router's default) the index also keeps, for each held block whose every ancestor is held too, its
*depth* (its position in the chain, from the first block), from the stored events' parent links: then
"the first ``i`` blocks are held" is one lookup, ``depth[hashes[i - 1]] == i``, and the answer is a binary
search, ~17 lookups for a 100k-token prompt where a walk takes thousands (~1 ms). A removed block takes
its descendants' depths with it, and a block stored again gives them back. A worker whose chains the
index cannot know (its state came from a dump without parents, or an event without them) is matched by
the walk: per candidate, how many leading blocks its block set holds, from a binary search for the
first one it lacks confirmed by one C-speed ``issuperset`` (a scan that stops at the first block it lacks
when the guess is not confirmed). Both give the same answer (a property test holds it).

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
from itertools import islice, takewhile


@dataclass(frozen=True)
class StoredEvent:
    """Blocks now held by a worker (each the child of the one before). ``chained``: ``parent`` is the first
    block's parent hash (None: the first block starts a chain); not chained, the index cannot place them."""

    event_id: int
    block_hashes: tuple[int, ...]
    parent: int | None = None
    chained: bool = False


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
    chains: _Chains | None = None  # None: matched by the walk


class _Chains:
    """Parent links of a worker's held blocks, their held children, and the depth of each block whose every
    ancestor is held (see module docstring)."""

    __slots__ = ("children", "depth", "parent")

    def __init__(self) -> None:
        self.parent: dict[int, int | None] = {}
        self.children: dict[int, list[int]] = {}  # held children, also of a parent no longer held
        self.depth: dict[int, int] = {}

    def stored(self, parent: int | None, hashes: Sequence[int]) -> None:
        parents, children, depth = self.parent, self.children, self.depth
        d = 0 if parent is None else depth.get(parent, -1)  # -1: some ancestor is not held
        for h in hashes:
            if h not in parents:
                parents[h] = parent
                if parent is not None:
                    children.setdefault(parent, []).append(h)
                if d >= 0:
                    d += 1
                    depth[h] = d
                    if h in children:
                        self._deepen(h, d)
            else:  # held already (stored again): its chain is what it was
                d = depth.get(h, -1)
            parent = h

    def _deepen(self, root: int, d: int) -> None:
        """``root`` has depth ``d`` now: held descendants below it regain theirs."""
        stack = [(root, d)]
        while stack:
            block, at = stack.pop()
            for child in self.children.get(block, ()):
                if child not in self.depth:
                    self.depth[child] = at + 1
                    stack.append((child, at + 1))

    def removed(self, hashes: Iterable[int]) -> None:
        parents, children, depth = self.parent, self.children, self.depth
        for h in hashes:
            if h not in parents:
                continue
            parent = parents.pop(h)
            if parent is not None:
                siblings = children.get(parent)
                if siblings is not None:
                    siblings.remove(h)
                    if not siblings:
                        del children[parent]
            if h in depth:  # it and every descendant with a depth lose it
                stack = [h]
                while stack:
                    if depth.pop(block := stack.pop(), None) is not None:
                        stack.extend(children.get(block, ()))

    def matched(self, block_hashes: Sequence[int]) -> int:
        """How many leading blocks are held: the largest ``i`` with ``depth[block_hashes[i - 1]] == i``."""
        depth = self.depth
        lo, hi = 0, len(block_hashes)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if depth.get(block_hashes[mid - 1]) == mid:
                lo = mid
            else:
                hi = mid - 1
        return lo


def _held_prefix(blocks: set[int], block_hashes: Sequence[int]) -> int:
    """The walk: how many leading ``block_hashes`` are in ``blocks``.

    A worker's blocks are usually prefix-closed (every engine here evicts a chain's tail before its head), so
    the first missing block is guessed by a binary search (~17 lookups at 100k tokens) and taken when one
    C-speed ``issuperset`` confirms every block before it is held: about half the cost of ``takewhile`` over
    ``__contains__``, which stays the answer when the guess is not confirmed.
    """
    total = len(block_hashes)
    if not total or block_hashes[0] not in blocks:
        return 0
    lo, hi = 1, total  # block_hashes[lo - 1] is held; block_hashes[hi] (when hi < total) is not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if block_hashes[mid - 1] in blocks:
            lo = mid
        else:
            hi = mid - 1
    if blocks.issuperset(islice(block_hashes, lo)):  # (no copy of the prefix first)
        return lo
    return len(list(takewhile(blocks.__contains__, block_hashes)))


class KvIndex:
    """Each worker's block set (block hashes) and event position."""

    def __init__(self, *, chains: bool = True) -> None:
        """``chains``: keep block depths for matching in O(log n) lookups (see module docstring)."""
        self._chains = chains
        self._workers: dict[str, _WorkerState] = {}
        self.gaps_seen = 0
        self.events_applied = 0

    # -- events ---------------------------------------------------------------------------------

    def apply(self, worker_id: str, events: Iterable[KvEvent]) -> bool:
        """Apply one worker's events in order; True when a gap was found and the worker needs repair."""
        state = self._workers.get(worker_id)
        if state is None:
            state = self._workers[worker_id] = self._new_state()
        if not state.synced:
            state.pending.extend(events)
            if state.last_event_id == 0 and state.pending and state.pending[0].event_id == 1:
                state.synced = True  # seen from its very first event: nothing to repair
                return self._drain(worker_id, state)
            return bool(state.pending)
        return self._apply_in_order(worker_id, state, list(events))

    def _new_state(self) -> _WorkerState:
        return _WorkerState(chains=_Chains() if self._chains else None)

    def _state(self, worker_id: str) -> _WorkerState:
        state = self._workers.get(worker_id)
        if state is None:
            state = self._workers[worker_id] = self._new_state()
        return state

    def begin_recovery(self, worker_id: str) -> None:
        """Hold this worker's events back until a replay or dump repairs it."""
        state = self._state(worker_id)
        state.synced = False

    def apply_replay(self, worker_id: str, events: Sequence[KvEvent]) -> bool:
        """Events fetched from the worker after a gap; True if a gap remains (ask for a dump)."""
        state = self._state(worker_id)
        state.pending = sorted([*events, *state.pending], key=lambda e: e.event_id)
        state.synced = True
        return self._drain(worker_id, state)

    def apply_dump(self, worker_id: str, last_event_id: int, block_hashes: Sequence[int],
                   parents: Sequence[int | None] | None = None) -> bool:
        """Replace the worker's block set with a dump taken at ``last_event_id``; True if a gap remains.
        ``parents``: each block's parent (None: a first block); without them the worker is matched by the
        walk until its cache is cleared."""
        state = self._state(worker_id)
        state.blocks = set(block_hashes)
        state.chains = None
        if parents is not None and self._chains:
            state.chains = chains = _Chains()
            for block, parent in zip(block_hashes, parents, strict=True):  # any order: depths follow parents
                chains.stored(parent, (block,))
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
            chains = state.chains
            if isinstance(event, StoredEvent):
                state.blocks.update(event.block_hashes)
                if chains is not None:
                    if event.chained:
                        chains.stored(event.parent, event.block_hashes)
                    else:
                        state.chains = None
            elif isinstance(event, RemovedEvent):
                state.blocks.difference_update(event.block_hashes)
                if chains is not None:
                    chains.removed(event.block_hashes)
            else:
                state.blocks = set()
                state.chains = _Chains() if self._chains else None  # nothing held: every chain known again
        return False

    def remove_worker(self, worker_id: str) -> None:
        self._workers.pop(worker_id, None)

    # -- queries --------------------------------------------------------------------------------

    def overlaps(self, block_hashes: Sequence[int], candidates: Iterable[str]) -> dict[str, int]:
        """Leading blocks of ``block_hashes`` each candidate holds (0 for none): by chain depths, else by the
        walk (see module docstring)."""
        workers = self._workers
        result: dict[str, int] = {}
        for worker in candidates:
            state = workers.get(worker)
            if state is None:
                result[worker] = 0
            elif state.chains is not None:
                result[worker] = state.chains.matched(block_hashes)
            else:
                result[worker] = _held_prefix(state.blocks, block_hashes)
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
