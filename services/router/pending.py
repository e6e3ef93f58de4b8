"""The pending-prefix index: prompt blocks a worker will hold because this router just sent it a request.

A worker's KV events reach the router only after the worker has scheduled (or, for some engines, computed)
the prompt; requests that share a long prefix and arrive together — sibling sub-agents launched at once —
would otherwise be placed before any of that is known and spread over idle workers, each prefilling the
same prefix. As in Dynamo's KV router (its approximate indexer predicts blocks from its own routing
decisions with a TTL; its active-sequence tracking counts blocks shared by in-flight requests once), each
placement records two things here, per worker:

* **predicted** blocks: the request's full prompt blocks the index did not show on that worker. They
  count as overlap like cached blocks while the request prefills and for ``ttl`` seconds after its first
  frame; a ``KvStored`` / ``KvRemoved`` event naming a block replaces the prediction with the worker's own
  word, a ``KvCleared`` drops all of the worker's; a request that fails or is cancelled before its first
  frame drops its own.
* **computing** blocks: the blocks the request prefills itself (those past its overlap), until its first
  frame or its end. A later request that reuses some of them waits for them, but would have to compute
  them itself anywhere else, so that part of the worker's prefill in flight is not counted again as queue
  in front of it (:meth:`PendingPrefixes.match` reports it as ``shared``; ``policy.py`` subtracts it).

Predictions are reference-counted per worker block; an event removes a block's count whole, so an entry
that ends later may take back a count a newer entry added for the same block after the event: a rare early
loss of a prediction, never a stale gain. Nothing here reads the network; the clock is injected.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import islice, repeat, takewhile

from services.router.index import ClearedEvent, KvEvent

DEFAULT_PENDING_TTL = 3.0


@dataclass
class _WorkerPending:
    predicted: dict[int, int] = field(default_factory=dict)   # block hash -> entries predicting it
    computing: dict[int, int] = field(default_factory=dict)   # block hash -> prefilling entries computing it


class PendingEntry:
    """One placement's predicted and computing blocks on one worker (see :class:`PendingPrefixes`)."""

    __slots__ = ("computing", "ended", "expires_at", "predicted", "prefilling", "state", "worker_id")

    def __init__(self, worker_id: str, state: _WorkerPending, predicted: tuple[int, ...],
                 computing: tuple[int, ...]) -> None:
        self.worker_id = worker_id
        self.state = state  # not looked up by id: a worker that left and came back starts afresh
        self.predicted = predicted
        self.computing = computing
        self.prefilling = True
        self.ended = False
        self.expires_at = float("inf")


@dataclass(frozen=True)
class PendingMatch:
    """What the pending index adds to one worker's overlap for one request."""

    predicted: int = 0   # leading blocks past the cached overlap that the worker is predicted to hold
    shared: int = 0      # blocks of the whole overlap that requests in flight there are computing now


class PendingPrefixes:
    """Per worker, the prompt blocks of requests this router placed whose KV events have not arrived yet."""

    def __init__(self, ttl: float = DEFAULT_PENDING_TTL, clock: Callable[[], float] = time.monotonic) -> None:
        if ttl <= 0:
            raise ValueError("pending-prefix ttl must be > 0 (leave the index out to turn it off)")
        self.ttl = ttl
        self._clock = clock
        self._workers: dict[str, _WorkerPending] = {}
        self._expiring: deque[PendingEntry] = deque()  # prefill done, in expiry order (one ttl for all)

    def add(self, worker_id: str, block_hashes: Sequence[int], cached: int, overlap: int) -> PendingEntry:
        """Record a placement on ``worker_id``: its full prompt blocks ``block_hashes``, of which the index
        showed the first ``cached`` and index plus predictions the first ``overlap``."""
        self.expire()
        state = self._workers.setdefault(worker_id, _WorkerPending())
        entry = PendingEntry(worker_id, state, tuple(block_hashes[cached:]), tuple(block_hashes[overlap:]))
        _count(state.predicted, entry.predicted)
        _count(state.computing, entry.computing)
        return entry

    def prefill_done(self, entry: PendingEntry) -> None:
        """The request's first frame arrived: it computes nothing more; its prediction lasts ``ttl`` more."""
        if not entry.prefilling or entry.ended:
            return
        entry.prefilling = False
        _uncount(entry.state.computing, entry.computing)
        entry.expires_at = self._clock() + self.ttl
        self._expiring.append(entry)

    def drop(self, entry: PendingEntry) -> None:
        """Forget a placement now (its request failed or was cancelled before its first frame)."""
        if entry.ended:
            return
        entry.ended = True
        _uncount(entry.state.predicted, entry.predicted)
        if entry.prefilling:
            _uncount(entry.state.computing, entry.computing)

    def on_events(self, worker_id: str, events: Iterable[KvEvent]) -> None:
        """The worker's own word replaces predictions of the blocks it names (stored or removed)."""
        state = self._workers.get(worker_id)
        if state is None or not state.predicted:
            return
        for event in events:
            if isinstance(event, ClearedEvent):
                state.predicted.clear()
                return
            deque(map(state.predicted.pop, event.block_hashes, repeat(None)), maxlen=0)  # C-speed

    def remove_worker(self, worker_id: str) -> None:
        """The worker left: its entries end with it (their holders may still call ``prefill_done``/``drop``)."""
        self._workers.pop(worker_id, None)

    def expire(self) -> None:
        """End the predictions whose ``ttl`` after their first frame has passed."""
        now = self._clock()
        while self._expiring and self._expiring[0].expires_at <= now:
            self.drop(self._expiring.popleft())

    def match(self, worker_id: str, block_hashes: Sequence[int], cached: int, holds: Container[int]) -> PendingMatch:
        """Extend a worker's cached overlap (``cached`` leading blocks of ``block_hashes``, the worker's block
        set ``holds``) through blocks predicted there, and count the overlap's blocks being computed there."""
        state = self._workers.get(worker_id)
        if state is None or not (state.predicted or state.computing):
            return PendingMatch()
        end = cached
        if state.predicted:
            # Alternate runs of predicted and cached blocks (C-speed scans) until neither goes on.
            scans = (state.predicted.__contains__, holds.__contains__)
            total, stalled, turn = len(block_hashes), 0, 0
            while end < total and stalled < 2:
                run = _run(scans[turn], block_hashes, end)
                end += run
                stalled = 0 if run else stalled + 1
                turn ^= 1
        computing = state.computing
        shared = sum(map(computing.__contains__, block_hashes[:end])) if computing else 0
        return PendingMatch(end - cached, shared)

    def predicted_blocks(self, worker_id: str) -> int:
        """Distinct blocks predicted on the worker now (metrics, tests)."""
        state = self._workers.get(worker_id)
        return len(state.predicted) if state is not None else 0

    def computing_blocks(self, worker_id: str) -> int:
        state = self._workers.get(worker_id)
        return len(state.computing) if state is not None else 0


def _run(contains: Callable[[int], bool], block_hashes: Sequence[int], start: int) -> int:
    """How many blocks from ``start`` on pass ``contains``."""
    return len(list(takewhile(contains, islice(block_hashes, start, None))))


def _count(counts: dict[int, int], blocks: Sequence[int]) -> None:
    if counts.keys().isdisjoint(blocks):  # the usual case, in C: none counted yet (a prompt's blocks are distinct)
        counts.update(zip(blocks, repeat(1)))
        return
    for block in blocks:
        counts[block] = counts.get(block, 0) + 1


def _uncount(counts: dict[int, int], blocks: Sequence[int]) -> None:
    held = list(map(counts.pop, blocks, repeat(None)))
    if held.count(1) + held.count(None) == len(held):  # the usual case, in C: each counted once (by this entry) or gone
        return
    counts.update((block, n) for block, n in zip(blocks, held, strict=True) if n is not None)  # as they were
    for block in blocks:
        n = counts.get(block)
        if n is None:
            continue  # replaced by an event
        if n <= 1:
            del counts[block]
        else:
            counts[block] = n - 1
