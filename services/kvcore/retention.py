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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import compress, count, islice, repeat
from operator import and_, is_, is_not, ne, not_

# Tool-call start markers that are one token in their models' vocabularies (Hermes/Qwen, Llama 3, Nemotron,
# Mistral, Kimi, DeepSeek): a turn whose output holds one ended in a tool call.
TOOL_CALL_MARKERS = ("<tool_call>", "<|python_tag|>", "<TOOLCALL>", "[TOOL_CALLS]", "<|tool_calls_section_begin|>",
                     "<\uff5ctool\u2581calls\u2581begin\uff5c>")


@dataclass(frozen=True)
class RetentionHint:
    """How a request's blocks are kept once it ends: leased for ``hold_s`` seconds (the client marked the prompt
    for caching), or for ``tool_call_hold_s`` when its output holds one of ``tool_call_ids`` (the turn ended in
    a tool call: the harness's next turn follows within its tool time), or evicted first (the agent will not
    come back)."""

    hold_s: float = 0.0
    first: bool = False
    tool_call_hold_s: float = 0.0
    tool_call_ids: frozenset[int] = frozenset()
    strong: bool = False        # ``hold_s`` is a tool wait known in advance (the replay: the trace says so)

    def lease_for(self, generated: Sequence[int]) -> tuple[float, bool]:
        """(seconds, strong) of the lease for a request that generated ``generated``: strong for a tool call."""
        if self.tool_call_hold_s > 0 and not self.tool_call_ids.isdisjoint(generated):
            return max(self.tool_call_hold_s, self.hold_s), True
        return self.hold_s, self.strong


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


_NO_LEASE = -math.inf
_MARK = float("-inf")  # the value of a block marked to go first (compared by identity; never live, never expired)


def choose_victims(lru: dict[int, None], leases: dict[int, float], first: dict[int, None], now: float, evict: int,
                   stats: RetentionStats, sealed: list[float] | None = None) -> list[int]:
    """The ``evict`` inactive blocks to evict (``lru``: oldest first; it holds at least ``evict``). Leases and
    marks of the victims end; leased blocks passed over move to ``lru``'s newest end (still inactive).

    ``leases``: block hash -> its lease's end (a :class:`_Strong` one for a tool wait) or :data:`_MARK`; ``first``:
    the marked blocks in marking order, and stale entries (no longer marked) that are skipped. ``sealed``: told
    (appended) the earliest lease end when every block of ``lru`` holds a live strong lease (see
    :meth:`Retention.victims`)."""
    _drop_stale_marks(leases, first)
    if not first:  # the usual case: none of the least recently used blocks is leased
        oldest = list(islice(lru, evict))
        if leases.keys().isdisjoint(oldest):
            return oldest
    victims: list[int] = []
    while first and len(victims) < evict:
        h = next(iter(first))
        del first[h]
        if leases.get(h) is _MARK:
            del leases[h]
            if h in lru:
                victims.append(h)
    kept: list[int] = []
    if len(victims) < evict:
        _scan(lru, leases, now, evict, victims, kept, stats)
    if len(victims) < evict:  # soft: leased blocks go too, plain leases before strong ones, each oldest first
        strong = [type(leases[h]) is _Strong for h in kept]
        if sealed is not None and not victims and all(strong):  # the scan passed every block: all hold one
            sealed.append(min(map(leases.__getitem__, kept)))
        order = [*compress(kept, map(not_, strong)), *compress(kept, strong)] if any(strong) else kept
        broken = order[: evict - len(victims)]
        gone = set(broken)
        kept = [h for h in kept if h not in gone]
        victims += broken
        deque(map(leases.pop, broken), maxlen=0)
        stats.broken_blocks += len(broken)
    if kept:
        deque(map(lru.pop, kept), maxlen=0)
        lru.update(zip(kept, repeat(None)))
    return victims


def _drop_stale_marks(leases: dict[int, float], first: dict[int, None]) -> None:
    """Entries at the head of ``first`` whose block is no longer marked (reused or leased since) go."""
    while first:
        h = next(iter(first))
        if leases.get(h) is _MARK:
            return
        del first[h]


def _scan(lru: dict[int, None], leases: dict[int, float], now: float, evict: int, victims: list[int],
          kept: list[int], stats: RetentionStats) -> None:
    """Extend ``victims`` to ``evict`` blocks in LRU order with blocks under no live lease (expired leases end);
    the leased blocks passed over go to ``kept``. In chunks, each checked in C passes (a lease-free block's end
    reads as -inf; no block is marked by now)."""
    chosen = set(victims)
    blocks = (h for h in lru if h not in chosen) if chosen else iter(lru)
    while len(victims) < evict:
        chunk = list(islice(blocks, 2 * (evict - len(victims)) + 64))
        if not chunk:
            return
        ends = list(map(leases.get, chunk, repeat(_NO_LEASE)))
        free = list(map(now.__ge__, ends))
        at = list(compress(count(), free))
        need = evict - len(victims)
        if len(at) >= need:  # the chunk ends with the last victim needed
            cut = at[need - 1] + 1
            chunk, ends, free = chunk[:cut], ends[:cut], free[:cut]
        victims += compress(chunk, free)
        kept += compress(chunk, map(not_, free))
        expired = list(compress(chunk, map(and_, free, map(ne, ends, repeat(_NO_LEASE)))))
        if expired:
            deque(map(leases.pop, expired), maxlen=0)
            stats.expired_blocks += len(expired)


class Retention:
    """One block manager's leases and evict-first marks, on its clock (seconds).

    One dict holds both, block hash -> lease end or :data:`_MARK`, so a sequence's lease or reuse is one pass
    over its blocks; ``first`` orders the marks lazily (an entry whose block is no longer marked is skipped)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.leases: dict[int, float] = {}     # block hash -> when its lease ends (_Strong: a tool wait), or _MARK
        self.first: dict[int, None] = {}       # marked block hashes in marking order (and stale entries)
        self.stats = RetentionStats()
        # (LRU epoch, earliest end): at that epoch of the caller's LRU list every block in it held a strong lease
        # ending no earlier (blocks only left it since: the epoch moves when one enters or moves)
        self._sealed: tuple[int, float] | None = None

    @property
    def held_blocks(self) -> int:
        """Blocks under a lease (some may have expired and not been looked at since)."""
        leases = self.leases
        return len(leases) - sum(map(is_, leases.values(), repeat(_MARK))) if self.first else len(leases)

    def retain(self, hashes: list[int], hold_s: float, first: bool, strong: bool = False) -> None:
        """A sequence holding ``hashes`` ended: lease them for ``hold_s`` seconds (``strong``: a tool wait), or
        mark them ``first``."""
        stats, leases = self.stats, self.leases
        if first:
            marks = self.first
            if marks:  # blocks marked already keep their place; the others go to the end
                again = list(compress(hashes, map(is_not, map(leases.get, hashes), repeat(_MARK))))
                deque(map(marks.pop, again, repeat(None)), maxlen=0)
            marks.update(zip(hashes, repeat(None)))
            leases.update(zip(hashes, repeat(_MARK)))
            stats.marked_blocks += len(hashes)
            return
        end = self.clock() + hold_s
        leases.update(zip(hashes, repeat(_Strong(end) if strong else end)))
        stats.leases += 1
        stats.leased_blocks += len(hashes)

    def reused(self, hashes: list[int]) -> None:
        """An admission took ``hashes``: their leases and marks end; leased ones count as lease hits."""
        if self.leases:
            ends = list(map(self.leases.pop, hashes, repeat(_NO_LEASE)))
            if ends.count(_NO_LEASE) != len(ends):
                live = sum(map(self.clock().__lt__, ends))
                if live:
                    self.stats.hits += 1
                    self.stats.hit_blocks += live

    def victims(self, lru: dict[int, None], evict: int, epoch: int = -1) -> tuple[list[int], bool]:
        """:func:`choose_victims` on this manager's leases and marks; and whether blocks passed over moved.

        ``epoch``: the caller's count of blocks entering or moving in ``lru`` (-1: unknown). Under KV pressure
        every inactive block may be leased: then each eviction would scan them all to break the oldest leases.
        When a scan found so, and since then blocks only left the list (same epoch) and no lease ended, the
        answer is the same without the scan: the list's oldest blocks, nothing moved."""
        now = self.clock()
        sealed = self._sealed
        if sealed is not None and sealed[0] == epoch >= 0 and now < sealed[1]:
            _drop_stale_marks(self.leases, self.first)
            if not self.first:
                victims = list(islice(lru, evict))
                deque(map(self.leases.pop, victims), maxlen=0)
                self.stats.broken_blocks += len(victims)
                return victims, False
        newest = next(reversed(lru), None)
        ends: list[float] = []
        victims = choose_victims(lru, self.leases, self.first, now, evict, self.stats, ends)
        moved = next(reversed(lru), None) != newest
        self._sealed = (epoch + moved, ends[0]) if ends and epoch >= 0 else None
        return victims, moved

    def clear(self) -> None:
        self.leases.clear()
        self.first.clear()
        self._sealed = None
