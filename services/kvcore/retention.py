"""Agent-aware retention of inactive KV blocks: soft leases and evict-first marks (issue 35).

The block manager keeps inactive blocks in one LRU list; retention only changes which of them an
allocation evicts: blocks marked *first* (a finished sub-agent, a closed session), then blocks without a
live lease in LRU order, then blocks under a plain lease (the client's ``cache_control``), then blocks under
a *strong* lease (a session waiting on a tool call), each in LRU order. A lease never makes an allocation
fail. :class:`RetentionHint` is what a request asks for when it ends.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import compress, count, islice, repeat
from operator import and_, ne, not_

# Tool-call start markers that are one token in their models' vocabularies (Hermes/Qwen, Llama 3, Nemotron,
# Mistral, Kimi, DeepSeek): a turn whose output holds one ended in a tool call.
TOOL_CALL_MARKERS = ("<tool_call>", "<|python_tag|>", "<TOOLCALL>", "[TOOL_CALLS]", "<|tool_calls_section_begin|>",
                     "<\uff5ctool\u2581calls\u2581begin\uff5c>")


@dataclass(frozen=True)
class RetentionHint:
    """How a request's blocks are kept once it ends: leased for ``hold_s`` seconds (the client marked the prompt
    for caching), or for ``tool_call_hold_s`` when its output holds one of ``tool_call_ids`` (the turn ended in
    a tool call: the harness's next turn follows within its tool time), or evicted first (the agent will not
    come back), or evicted first if it ends with an answer (``answer_first``: a sub-agent that answered its
    parent is done)."""

    hold_s: float = 0.0
    first: bool = False
    tool_call_hold_s: float = 0.0
    tool_call_ids: frozenset[int] = frozenset()
    strong: bool = False        # ``hold_s`` is a tool wait known in advance (the replay: the trace says so)
    answer_first: bool = False  # evict first if the output holds no tool-call marker (needs ``tool_call_ids``)

    def lease_for(self, generated: Sequence[int]) -> tuple[float, bool]:
        """(seconds, strong) of the lease for a request that generated ``generated``: strong for a tool call."""
        if self.tool_call_hold_s > 0 and not self.tool_call_ids.isdisjoint(generated):
            return max(self.tool_call_hold_s, self.hold_s), True
        return self.hold_s, self.strong

    def first_for(self, generated: Sequence[int]) -> bool:
        """Whether a request that generated ``generated`` has its blocks go first: marked so, or it answered
        (no tool-call marker; a vocabulary without markers cannot tell, and nothing goes first)."""
        return self.first or (self.answer_first and bool(self.tool_call_ids)
                              and self.tool_call_ids.isdisjoint(generated))


def tool_call_ids(token_to_id: Callable[[str], int | None]) -> frozenset[int]:
    """The ids of :data:`TOOL_CALL_MARKERS` that are single tokens of a vocabulary."""
    return frozenset(i for i in map(token_to_id, TOOL_CALL_MARKERS) if i is not None)


@dataclass
class RetentionStats:
    """What retention did on one block manager (metrics, span attributes, the replay's report)."""

    leases: int = 0              # sequences whose blocks were leased
    leased_blocks: int = 0
    hits: int = 0                # admissions that reused blocks under a live lease
    hit_blocks: int = 0          # blocks reused under a live lease
    expired_blocks: int = 0      # leased blocks evicted after their lease ended
    broken_blocks: int = 0       # leased blocks evicted under a live lease (nothing else was left: soft)
    marked_blocks: int = 0       # blocks marked to go first


class _Strong(float):
    """A strong lease's end (a tool wait): a float, so scans compare it at C speed."""

    __slots__ = ()


NO_LEASE = -math.inf   # an inactive block's value in the LRU list when it is under no lease
MARK = float("-inf")   # the value of a block marked to go first (told apart by identity; never live, never expired)


def choose_victims(lru: dict[int, float], active: dict[int, float], first: dict[int, None], now: float, evict: int,
                   stats: RetentionStats, sealed: list[float] | None = None) -> list[int]:
    """The ``evict`` inactive blocks to evict (``lru``: oldest first, each block's lease end, :data:`NO_LEASE` or
    :data:`MARK`; it holds at least ``evict``); they leave with their leases and marks. Leased blocks passed over
    move to ``lru``'s newest end (still inactive). ``active``: leases and marks of blocks in use; ``first``: the
    marked blocks in marking order, and stale entries (no longer marked) that are skipped. ``sealed``: told
    (appended) the earliest lease end when every block of ``lru`` holds a live strong lease (see
    :meth:`Retention.victims`)."""
    _drop_stale_marks(lru, active, first)
    if not first and evict == 1:  # a decode's new block: the first block under no live lease, a few leased passed
        victim = _first_free(lru, now, stats)
        if victim is not None:
            return [victim]
    elif not first:  # the usual case: none of the least recently used blocks is leased
        oldest = list(islice(lru, evict))
        if list(islice(lru.values(), evict)).count(NO_LEASE) == evict:
            return oldest
    victims: list[int] = []
    while first and len(victims) < evict:
        h = next(iter(first))
        del first[h]
        value = lru.get(h)
        if value is not None:
            if value is MARK:
                victims.append(h)
        elif active.get(h) is MARK:  # in use: the mark ends
            del active[h]
    kept: list[int] = []
    if len(victims) < evict:
        _scan(lru, now, evict, victims, kept, stats)
    if len(victims) < evict:  # soft: leased blocks go too, plain leases before strong ones, each oldest first
        strong = [type(lru[h]) is _Strong for h in kept]
        if sealed is not None and not victims and all(strong):  # the scan passed every block: all hold one
            sealed.append(min(map(lru.__getitem__, kept)))
        order = [*compress(kept, map(not_, strong)), *compress(kept, strong)] if any(strong) else kept
        broken = order[: evict - len(victims)]
        gone = set(broken)
        kept = [h for h in kept if h not in gone]
        victims += broken
        stats.broken_blocks += len(broken)
    if kept:
        ends = list(map(lru.pop, kept))
        lru.update(zip(kept, ends, strict=True))
    return victims


def _first_free(lru: dict[int, float], now: float, stats: RetentionStats, most: int = 64) -> int | None:
    """:func:`choose_victims` of one block, without marks, when one of the ``most`` oldest blocks is under no live
    lease (None, nothing changed: there is none)."""
    kept: list[int] = []
    for h, end in lru.items():
        if now >= end:
            break
        if len(kept) == most:
            return None
        kept.append(h)
    else:
        return None
    if end != NO_LEASE:
        stats.expired_blocks += 1
    if kept:
        lru.update(zip(kept, list(map(lru.pop, kept)), strict=True))
    return h


def _marked(lru: dict[int, float], active: dict[int, float], h: int) -> bool:
    value = lru.get(h)
    return (value if value is not None else active.get(h)) is MARK


def _drop_stale_marks(lru: dict[int, float], active: dict[int, float], first: dict[int, None]) -> None:
    """Entries at the head of ``first`` whose block is no longer marked (reused or leased since) go."""
    while first:
        h = next(iter(first))
        if _marked(lru, active, h):
            return
        del first[h]


def _scan(lru: dict[int, float], now: float, evict: int, victims: list[int], kept: list[int],
          stats: RetentionStats) -> None:
    """Extend ``victims`` to ``evict`` blocks in LRU order with blocks under no live lease (expired leases end);
    the leased blocks passed over go to ``kept``. In chunks, each checked in C passes (a lease-free block's end
    reads as -inf; no block is marked by now)."""
    chosen = set(victims)
    blocks = (h for h in lru if h not in chosen) if chosen else iter(lru)
    values = None if chosen else iter(lru.values())  # in step with ``blocks``
    while len(victims) < evict:
        chunk = list(islice(blocks, 2 * (evict - len(victims)) + 64))
        if not chunk:
            return
        ends = list(map(lru.__getitem__, chunk)) if values is None else list(islice(values, len(chunk)))
        free = list(map(now.__ge__, ends))
        at = list(compress(count(), free))
        need = evict - len(victims)
        if len(at) >= need:  # the chunk ends with the last victim needed
            cut = at[need - 1] + 1
            chunk, ends, free = chunk[:cut], ends[:cut], free[:cut]
        victims += compress(chunk, free)
        kept += compress(chunk, map(not_, free))
        stats.expired_blocks += sum(map(and_, free, map(ne, ends, repeat(NO_LEASE))))


class Retention:
    """One block manager's leases and evict-first marks, on its clock (seconds).

    An inactive block's lease end (or mark) is its value in the manager's LRU list (``lru``), so a sequence's
    lease or reuse costs no pass over its blocks beyond the list's own; blocks in use keep theirs in
    ``active`` (a shared head leased by one of its holders, a cached twin adopted). ``first`` orders the marks
    lazily (an entry whose block is no longer marked is skipped)."""

    def __init__(self, clock: Callable[[], float], lru: Callable[[], dict[int, float]] = dict) -> None:
        """``lru``: the manager's LRU list (inactive block hash -> its lease end, :data:`NO_LEASE` or :data:`MARK`)."""
        self.clock = clock
        self._lru = lru
        self.active: dict[int, float] = {}     # leases and marks of blocks in use
        self.first: dict[int, None] = {}       # marked block hashes in marking order (and stale entries)
        self.used = False                      # a lease or mark was granted (since the last clear)
        self.leased = 0                        # blocks (inactive or in use) under a lease
        self.stats = RetentionStats()
        # every inactive block holds a strong lease ending no earlier than this (None: not known so): a scan found
        # so, and every block that went inactive since came with one (see :meth:`victims`)
        self._sealed: float | None = None

    @property
    def held_blocks(self) -> int:
        """Blocks under a lease (some may have expired and not been looked at since)."""
        return self.leased

    def grant(self, hashes: list[int], hold_s: float, first: bool, strong: bool = False) -> float:
        """The value a sequence's blocks ``hashes`` take when it ends with a hint: a lease for ``hold_s`` seconds
        (``strong``: a tool wait), or :data:`MARK` (``first``); counted, marks ordered (not set: see
        :meth:`released`, :meth:`retain`)."""
        self.used = True
        stats = self.stats
        if first:
            marks = self.first
            if marks:  # blocks marked already keep their place; the others go to the end
                lru, active = self._lru(), self.active
                again = [h for h in hashes if not _marked(lru, active, h)]
                deque(map(marks.pop, again, repeat(None)), maxlen=0)
            marks.update(zip(hashes, repeat(None)))
            stats.marked_blocks += len(hashes)
            return MARK
        stats.leases += 1
        stats.leased_blocks += len(hashes)
        end = self.clock() + hold_s
        return _Strong(end) if strong else end

    def retain(self, hashes: list[int], hold_s: float, first: bool, strong: bool = False) -> None:
        """Lease ``hashes`` (blocks in use or inactive) for ``hold_s`` seconds (``strong``: a tool wait), or mark
        them ``first``."""
        value = self.grant(hashes, hold_s, first, strong)
        lru, active = self._lru(), self.active
        before = [lru[h] if h in lru else active.get(h, NO_LEASE) for h in hashes]
        self.leased += (len(hashes) if value > NO_LEASE else 0) - (len(before) - before.count(NO_LEASE))
        inactive = list(filter(lru.__contains__, hashes))
        lru.update(zip(inactive, repeat(value)))
        self.active.update((h, value) for h in hashes if h not in lru)
        self._sealed = None

    def released(self, blocks: Iterable[int], count: int, lease: float | None) -> Iterable[float]:
        """The LRU values of ``blocks`` (``count`` of them) going inactive, in that order: ``lease`` (a hint's
        :meth:`grant`), or without one what each held while in use."""
        active = self.active
        if count and self._sealed is not None:  # blocks under no strong lease would break it
            self._sealed = min(self._sealed, lease) if isinstance(lease, _Strong) else None
        if lease is not None:
            if active:
                gone = list(map(active.pop, blocks, repeat(NO_LEASE)))
                self.leased -= len(gone) - gone.count(NO_LEASE)  # (a mark reads as NO_LEASE: -inf)
            if lease > NO_LEASE:
                self.leased += count
            return repeat(lease)
        return list(map(active.pop, blocks, repeat(NO_LEASE))) if active else repeat(NO_LEASE)

    def hold_active(self, blocks: list[int], lease: float) -> None:
        """``blocks`` stay in use (other sequences hold them) and take ``lease``."""
        active = self.active
        before = list(map(active.get, blocks, repeat(NO_LEASE)))
        self.leased += (len(blocks) if lease > NO_LEASE else 0) - (len(before) - before.count(NO_LEASE))
        active.update(zip(blocks, repeat(lease)))

    def reused(self, ends: list[float], held: list[int]) -> None:
        """An admission took inactive blocks whose values were ``ends`` and blocks in use ``held``: their leases and
        marks end; leased ones count as lease hits."""
        if self.active and held:
            ends += map(self.active.pop, held, repeat(NO_LEASE))
        if not ends:
            return
        if ends.count(ends[0]) == len(ends):  # the usual case: one lease (or none), its blocks' values the same object
            if ends[0] > NO_LEASE:
                self.leased -= len(ends)
                if self.clock() < ends[0]:
                    self.stats.hits += 1
                    self.stats.hit_blocks += len(ends)
            return
        unleased = ends.count(NO_LEASE)
        if unleased != len(ends):
            self.leased -= len(ends) - unleased
            live = sum(map(self.clock().__lt__, ends))
            if live:
                self.stats.hits += 1
                self.stats.hit_blocks += live

    def victims(self, lru: dict[int, float], evict: int) -> tuple[list[int], bool]:
        """:func:`choose_victims` on this manager's leases and marks; and whether blocks passed over moved.

        Under KV pressure every inactive block may be leased: then each eviction would scan them all to break the
        oldest leases. When a scan found every one under a strong lease, and since then only blocks under a strong
        lease went inactive (:meth:`released`) and no lease ended, the answer is the same without the scan: the
        list's oldest blocks, nothing moved."""
        now, stats = self.clock(), self.stats
        sealed = self._sealed
        if sealed is not None and now < sealed:
            _drop_stale_marks(lru, self.active, self.first)
            if not self.first:
                victims = list(islice(lru, evict))
                stats.broken_blocks += len(victims)
                self.leased -= len(victims)
                return victims, False
        newest = next(reversed(lru), None)
        ends: list[float] = []
        gone = stats.expired_blocks + stats.broken_blocks
        victims = choose_victims(lru, self.active, self.first, now, evict, stats, ends)
        self.leased -= stats.expired_blocks + stats.broken_blocks - gone  # the leased victims
        moved = next(reversed(lru), None) != newest
        self._sealed = ends[0] if ends else None
        return victims, moved

    def clear(self) -> None:
        self.active.clear()
        self.first.clear()
        self.used = False
        self.leased = 0
        self._sealed = None
