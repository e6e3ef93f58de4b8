"""A paged KV-cache block manager with prefix caching, modelled on vLLM's and Dynamo's mocker.

Invariants:

* Capacity is ``num_blocks`` physical blocks of ``block_size`` tokens. Every block is exactly one
  of: free, *active* (referenced by at least one sequence), or *inactive* (a full block no
  sequence references, kept for prefix reuse and evicted least-recently-used first, only when an
  allocation needs room).
* Full blocks are keyed by their chained sequence hash (``services.common.block_hash``) and shared
  between sequences (ref-counted). A sequence's last, partial block is private to it. When a
  partial block fills up and its hash is already cached, the sequence adopts the cached block and
  the private one is freed (no duplicate, no event).
* Events carry consecutive ids starting at 1: a newly cached full block emits ``KvStored`` (one
  event per run of consecutive blocks, with the parent hash), an eviction ``KvRemoved``, and
  :meth:`BlockManager.clear` ``KvCleared``. Removals are emitted before the stores of the same call.
* Failed allocations change nothing: :meth:`BlockManager.append` returns False and the caller
  decides (wait, or preempt another sequence).
* A block with one holder keeps no count (it is active because it is cached and not in the LRU list); only
  blocks with more holders have one (``_shared``). Held blocks lead a chain (a block's holders hold its whole
  prefix), so probe, acquire and free look up only a prompt's held head and read the rest from the LRU list's
  order where they can; ``tests/kvcore/test_block_manager_model.py`` checks every operation against a
  block-by-block reference model.
* Retention (``retention.py``): :meth:`BlockManager.free` may lease a sequence's blocks or mark them to go first;
  eviction then prefers other blocks, softly (never failing an allocation). Without either it is plain LRU.
* Each block of a sequence's token stream is hashed once: ``KvSequence.known`` keeps the stream's
  chained hashes across :meth:`BlockManager.free` (a preempted request re-admitted hashes nothing
  again), extended as the stream grows or seeded by a caller that already has them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import compress, count, islice, repeat, starmap, takewhile
from operator import add, eq, gt, not_, sub

from services.common.block_hash import chain, extend_hashes, local_block_hashes, sequence_hashes
from services.common.sequences import common_prefix
from services.kvcore.domain import KvCleared, KvEvent, KvRemoved, KvStored, StoredBlock, stored_blocks
from services.kvcore.retention import MARK, NO_LEASE, Retention
from services.kvcore.sequence import KvSequence, PartialBlock


class _Watch:
    """The last probe's inactive prefix blocks (a leaving one voids the probe): a list, whose set for membership
    tests is built on first use (an admission right after its probe never needs it)."""

    __slots__ = ("_set", "blocks")

    def __init__(self, blocks: list[int]) -> None:
        self.blocks = blocks
        self._set: set[int] | None = None

    def __len__(self) -> int:
        return len(self.blocks)  # a sequence's block hashes are distinct

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._as_set()

    def isdisjoint(self, hashes: list[int]) -> bool:
        return self._as_set().isdisjoint(hashes)

    def _as_set(self) -> set[int]:
        if self._set is None:
            self._set = set(self.blocks)
        return self._set


_NO_WATCH = _Watch([])


@dataclass
class _Probe:
    """The last :meth:`BlockManager.probe_prefix`: its answer holds while ``epoch`` is current."""

    seq: KvSequence
    limit: int
    matched: int
    epoch: int
    held: int = 0    # its first ``held`` blocks are referenced (active); the ``newest`` after them were the LRU
    newest: int = 0  # list's newest entries, newest first
    touched: bool = False


class BlockManager:
    """Ref-counted, prefix-cached KV blocks with LRU eviction and KV events (see module docstring)."""

    def __init__(
        self, num_blocks: int, block_size: int, on_event: Callable[[KvEvent], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.total_blocks = num_blocks
        self.block_size = block_size
        self._free_ids = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        # Full blocks: hash -> block id. Each is either inactive (in ``_inactive``) or active, referenced by one
        # sequence, or by 1 + ``_shared[hash]`` of them: plain ints in dicts, so bulk moves run at C speed, and a
        # block with one holder (nearly all) is moved in and out of the LRU list with no count kept anywhere.
        self._full: dict[int, int] = {}
        self._shared: dict[int, int] = {}
        # The LRU list: a plain dict (insertion order; cheaper per block than an OrderedDict, and a block's
        # whole prefix moves in and out of it at once); first = least recently used, a move = pop + insert.
        # Its newest ``_detached`` entries are not in the list any more: an admission took them (see
        # ``_inactive``).
        self._lru: dict[int, float] = {}  # values: retention's lease ends (NO_LEASE: none)
        self._detached = 0
        self._next_event_id = 1
        self._lru_epoch = 0                 # bumped whenever a block enters the LRU list or moves in it
        self._probe: _Probe | None = None   # the last probe_prefix (see there)
        self._watch = _NO_WATCH             # its inactive prefix blocks: one leaving the list voids it
        self.pending_events: list[KvEvent] = []
        self._on_event = on_event if on_event is not None else self.pending_events.append
        self.retention = Retention(clock, lambda: self._inactive)  # leases and marks, on ``clock`` (seconds)

    # -- accounting -----------------------------------------------------------------------------

    @property
    def free_blocks(self) -> int:
        """Blocks holding nothing."""
        return len(self._free_ids)

    @property
    def cached_blocks(self) -> int:
        """Inactive full blocks kept for reuse (evictable)."""
        return len(self._lru) - self._detached

    @property
    def _inactive(self) -> dict[int, float]:
        """The LRU list, exactly. An admission that takes the list's newest run (a session's next turn takes
        what its previous turn freed: thousands of blocks for a long prompt) only marks that run detached;
        it leaves the dict here, on the next use of the list, so a turn's first token does not wait for
        it. Only the list's oldest end (eviction, ``_lru`` itself) is read before that."""
        if self._detached:
            deque(starmap(self._lru.popitem, repeat((), self._detached)), maxlen=0)
            self._detached = 0
        return self._lru

    @property
    def active_blocks(self) -> int:
        """Blocks referenced by at least one sequence (full and partial)."""
        return self.total_blocks - self.free_blocks - self.cached_blocks

    @property
    def available_blocks(self) -> int:
        """Blocks an allocation may use: free plus evictable."""
        return self.free_blocks + self.cached_blocks

    def ref_count(self, block_hash: int) -> int:
        if block_hash not in self._full or (block_hash in self._lru and not self._is_detached(block_hash)):
            return 0
        return 1 + self._shared.get(block_hash, 0)

    def lru_order(self) -> list[int]:
        """Hashes of inactive blocks, next to be evicted first."""
        return list(islice(self._lru, len(self._lru) - self._detached))

    def block_ids(self, seq: KvSequence, start: int = 0) -> list[int]:
        """Block ids of ``seq``'s blocks from its ``start``-th on, in token order (its full blocks, then its partial
        one): the slots of a paged KV pool that follows this manager (the torch engine's)."""
        full = self._full
        ids = list(map(full.__getitem__, seq.hashes[start:] if start else seq.hashes))
        if seq.partial is not None:
            ids.append(seq.partial.block_id)
        return ids

    def _is_detached(self, block_hash: int) -> bool:
        return bool(self._detached) and block_hash in islice(reversed(self._lru), self._detached)

    # -- prefix reuse ---------------------------------------------------------------------------

    def match_prefix(self, token_ids: Sequence[int], salt: str = "") -> int:
        """How many leading full blocks of ``token_ids`` are cached (no side effects)."""
        matched = 0
        for h in sequence_hashes(token_ids, self.block_size, salt):
            if h not in self._full:
                break
            matched += 1
        return matched

    def acquire_prefix(self, seq: KvSequence, token_ids: Sequence[int]) -> int:
        """Reference the cached leading blocks of ``token_ids`` for an empty ``seq``; return cached tokens.

        At least one token is always left to compute (as in vLLM), so a fully cached prompt reports
        ``len - 1`` rounded down to whole blocks.
        """
        if seq.length or seq.partial is not None:
            raise ValueError("acquire_prefix needs an empty sequence")
        full = self._full
        probe = self._valid_probe(seq, max(0, (len(token_ids) - 1) // self.block_size))
        if probe is not None:  # the scheduler probed it just before: its scans hold
            hashes = seq.known[: probe.matched]
            idle = len(self._watch) == probe.matched
        else:
            prefix = self._prefix_hashes(seq, token_ids)
            hits = list(map(full.__contains__, prefix))  # C-speed scans: a 100k-token prompt has thousands of blocks
            hashes = prefix[: hits.index(False) if not all(hits) else len(hits)]
            idle = False
        # What _ref does block by block, in bulk: every block gains a reference, the unreferenced ones leave
        # the LRU list. A probe that holds says which leading blocks are held and which run after them is the
        # list's newest entries; only the blocks past both are looked up.
        inactive, shared = self._inactive, self._shared
        held_head, newest = (probe.held, probe.newest) if probe is not None else (0, 0)
        rest = hashes[held_head + newest:] if held_head or newest else hashes
        held = hashes[:held_head]
        unheld = None if idle else list(map(inactive.__contains__, rest))
        if unheld is None or all(unheld):  # the usual case: nobody else holds the rest of the prefix
            leaving = rest
        else:  # some are held already
            leaving = list(compress(rest, unheld))
            held += compress(rest, map(not_, unheld))
        if held:  # one more holder each
            shared.update(zip(held, map(add, map(shared.get, held, repeat(0)), repeat(1)), strict=True))
        if self.retention.used:  # the leases and marks of the blocks taken end (live ones count as hits)
            ends = list(map(inactive.pop, leaving, repeat(NO_LEASE)))
            ends += islice(reversed(inactive.values()), newest)
            self.retention.reused(ends, held)
        elif leaving:
            deque(map(inactive.pop, leaving, repeat(NO_LEASE)), maxlen=0)
        if newest:  # still the list's newest entries (the probe holds): they leave it later (_inactive)
            self._detached = newest
        if leaving or newest:
            if probe is not None:
                self._void_probe()  # it was this sequence's, now admitted
            elif self._watch and not self._watch.isdisjoint(leaving):  # (no probe: no newest run either)
                self._void_probe()
        seq.hashes = hashes
        seq.length = len(hashes) * self.block_size
        seq.tail = []
        return seq.length

    def probe_prefix(self, seq: KvSequence, token_ids: Sequence[int]) -> tuple[int, int]:
        """What :meth:`acquire_prefix` would take, without taking it: (cached leading blocks, how many of
        those are inactive, i.e. would stop being evictable).

        The request at the head of the waiting queue is probed every step until it fits, so the last
        probe is remembered (:class:`_Probe`) and answered again in O(1) while nothing it depends on
        changed: no block went into the LRU list or moved in it (``_lru_epoch``), none of its inactive
        prefix blocks left the list (``_watch``), and the block after its prefix is still not cached.
        """
        limit = max(0, (len(token_ids) - 1) // self.block_size)
        last = self._valid_probe(seq, limit)
        if last is not None:
            return last.matched, len(self._watch)
        prefix = self._prefix_hashes(seq, token_ids)
        full, inactive = self._full, self._inactive  # inactive: exactly the full blocks no sequence references
        # The usual case first: after a head that running sequences hold (a system prompt they share; held blocks
        # always lead: a block's holders hold its whole chain), the prefix goes on with the LRU list's newest
        # entries, newest first (the session's previous turn freed them last). They are read in order and
        # compared by identity, with no hash lookup: thousands of blocks of a long prompt cost a memcmp-like
        # scan, not a cache miss each.
        held = next(compress(count(), map(inactive.__contains__, prefix)), len(prefix))
        if held and not all(map(full.__contains__, prefix[:held])):
            held = run = 0
        elif held < len(prefix) and next(reversed(inactive)) == prefix[held]:  # (not read when it cannot match)
            newest = list(islice(reversed(inactive), len(prefix) - held))
            run = common_prefix(prefix[held:] if held else prefix, newest)
        else:
            run = 0
        rest = prefix[held + run:] if held or run else prefix
        # C-speed scans from there on. Past the held head a cached block is inactive (its holders would hold the
        # head's inactive block too), so one scan of the LRU list finds them; should it stop at a cached block
        # (a hash collision breaks that), both scans run.
        hits = len(list(takewhile(inactive.__contains__, rest)))
        if hits < len(rest) and rest[hits] in full:
            hits = len(list(takewhile(full.__contains__, rest)))
            watched = list(filter(inactive.__contains__, rest[:hits]))
        else:
            watched = rest[:hits]
        matched = held + run + hits
        self._watch = _Watch(prefix[held : held + run] + watched)
        self._probe = _Probe(seq, limit, matched, self._lru_epoch, held, run)
        return matched, len(self._watch)

    def _void_probe(self) -> None:
        """The last probe no longer holds; its watch goes with it (nothing is checked against it until the next
        probe: an admission consumed it, and a later eviction would otherwise build its set for nothing)."""
        self._probe = None
        self._watch = _NO_WATCH

    def _valid_probe(self, seq: KvSequence, limit: int) -> _Probe | None:
        """The last probe when it was of ``seq`` with this ``limit`` and still holds (see :meth:`probe_prefix`)."""
        last = self._probe
        if (last is not None and last.seq is seq and last.limit == limit and last.epoch == self._lru_epoch
                and (last.matched == limit or seq.known[last.matched] not in self._full)):
            return last
        return None

    def touch_prefix(self, seq: KvSequence, matched: int) -> None:
        """An admission that did not fit: leave the LRU order as acquiring the first ``matched`` blocks of
        ``seq``'s stream and freeing them again would (its inactive blocks become the most recently used,
        the first block last), without the work of doing so. The prefix of the request that is tried
        next counts as just used; :meth:`probe_prefix` gives ``matched`` (and its probe is remembered:
        when it was already touched and nothing moved since, there is nothing to do)."""
        last = self._probe
        if last is not None and last.seq is seq and last.matched == matched and last.touched \
                and last.epoch == self._lru_epoch:
            return  # its inactive blocks are still the most recently used ones, in that order
        inactive = self._inactive
        moved = list(filter(inactive.__contains__, reversed(seq.known[:matched])))
        inactive.update(zip(moved, list(map(inactive.pop, moved)), strict=True))  # each to the end, in this order
        self._lru_epoch += 1
        if last is not None and last.seq is seq and last.matched == matched:
            last.epoch, last.touched = self._lru_epoch, True

    def _prefix_hashes(self, seq: KvSequence, token_ids: Sequence[int]) -> list[int]:
        """The hashes of the blocks :meth:`acquire_prefix` may reuse (all full blocks but a last token's)."""
        limit = max(0, (len(token_ids) - 1) // self.block_size)
        known = extend_hashes(seq.known, token_ids, self.block_size, seq.seed, limit)
        return known if len(known) <= limit else known[:limit]

    # -- allocation -----------------------------------------------------------------------------

    def blocks_needed(self, seq: KvSequence, n_tokens: int) -> int:
        """New blocks that appending ``n_tokens`` to ``seq`` would allocate."""
        room = 0
        if seq.partial is not None:
            room = self.block_size - (seq.length - len(seq.hashes) * self.block_size)
        extra = max(0, n_tokens - room)
        return -(-extra // self.block_size)

    def can_append(self, seq: KvSequence, n_tokens: int) -> bool:
        return self.blocks_needed(seq, n_tokens) <= self.available_blocks

    def append(self, seq: KvSequence, token_ids: Sequence[int]) -> bool:
        """Hold KV for ``token_ids`` after ``seq``'s tokens; False (and no change) if blocks run out."""
        if not token_ids:
            return True
        bs = self.block_size
        if seq.partial is not None:
            used = seq.length - len(seq.hashes) * bs + len(token_ids)
            if used < bs:
                seq.tail.extend(token_ids)  # room in the partial block (a decode step): nothing taken, sealed or sent
                seq.length += len(token_ids)
                return True
            if used == bs and len(token_ids) == 1:  # a decode token fills the partial block
                self._seal_partial(seq, token_ids[0])
                return True
        elif len(token_ids) == 1 and bs > 1:  # a decode token opens a block
            return self._open_block(seq, token_ids[0])
        if not self.can_append(seq, len(token_ids)):
            return False
        removed: list[int] = []
        runs: list[tuple[int | None, list[StoredBlock]]] = []
        self._fill(seq, token_ids, removed, runs)
        if removed:
            self._emit(KvRemoved(self._event_id(), tuple(removed)))
        for parent, blocks in runs:
            self._emit(KvStored(self._event_id(), parent, tuple(blocks)))
        return True

    def _seal_partial(self, seq: KvSequence, token: int) -> None:
        """:meth:`_fill` of the one token that fills ``seq``'s partial block (a decode's block boundary, the
        replay's commonest append): the block is sealed, or its cached twin adopted."""
        hashes, block = seq.hashes, seq.partial
        assert block is not None
        index = len(hashes)
        parent = hashes[-1] if hashes else None
        h = seq.known[index] if index < len(seq.known) else self._hash_block(seq, (token,), seq.length, parent)
        hashes.append(h)
        seq.length += 1
        seq.tail = []
        seq.partial = None
        if h in self._full:  # a cached twin: adopted, the private block goes back
            self._free_ids.append(block.block_id)
            self._ref(h)
        else:
            self._full[h] = block.block_id
            self._emit(KvStored(self._event_id(), parent, (StoredBlock(h, block.block_id, self.block_size),)))

    def _open_block(self, seq: KvSequence, token: int) -> bool:
        """:meth:`append` of one token after ``seq``'s last full block (a decode's block boundary): one block
        taken (:meth:`_take_block_id`); False (no change) if none is left."""
        if not self.available_blocks:
            return False
        removed: list[int] = []
        seq.partial = PartialBlock(self._take_block_id(removed))
        if removed:
            self._emit(KvRemoved(self._event_id(), tuple(removed)))
        seq.tail = [token]
        seq.length += 1
        return True

    def extend_partial(self, seq: KvSequence, token_ids: Sequence[int]) -> None:
        """:meth:`append` of tokens that stay inside ``seq``'s partial block (nothing taken, sealed or sent)."""
        if seq.partial is None or seq.length - len(seq.hashes) * self.block_size + len(token_ids) >= self.block_size:
            raise ValueError("the tokens do not fit in the sequence's partial block")
        seq.tail.extend(token_ids)
        seq.length += len(token_ids)

    def free(self, seq: KvSequence, hold_s: float = 0.0, first: bool = False, strong: bool = False) -> None:
        """Drop ``seq``'s references: full blocks become inactive (tail first in LRU order); ``hold_s`` > 0 leases
        them for that many seconds (``strong``: a tool wait), ``first`` marks those no other sequence holds to go
        first (``retention.py``)."""
        shared, inactive, retention = self._shared, self._inactive, self.retention
        hashes = seq.hashes
        # Blocks other sequences hold too lead (a block's holders hold its whole chain): a shared head, found
        # by looking up only its own blocks, then a rest with this holder alone, checked in one C pass.
        head = len(list(takewhile(shared.__contains__, hashes))) if shared else 0
        rest = hashes[head:] if head else hashes
        # a mark spares the blocks a running request still holds (a sub-agent shares its harness's head)
        lease = retention.grant(rest if first else hashes, hold_s, first, strong) \
            if hashes and (hold_s > 0 or first) else None
        kept = None if first else lease  # what the blocks other sequences still hold take when they are freed
        if not shared or shared.keys().isdisjoint(rest):  # the usual case
            values = retention.released(reversed(rest), len(rest), lease)
            inactive.update(zip(reversed(rest), values, strict=False))  # tail first
            if head:  # those stay active with one holder less
                if kept is not None:
                    retention.hold_active(hashes[:head], kept)
                self._one_holder_less(hashes[:head], list(map(shared.__getitem__, hashes[:head])))
        else:  # shared blocks past a gap (only a hash collision could make one): block by block, in bulk
            order = hashes[::-1]
            others = list(map(shared.get, order, repeat(0)))
            going = list(compress(order, map(not_, others)))
            inactive.update(zip(going, retention.released(going, len(going), lease), strict=False))
            if kept is not None:
                retention.hold_active(list(compress(order, others)), kept)
            self._one_holder_less(order, others)
        if seq.hashes:
            self._lru_epoch += 1
        if seq.partial is not None:
            self._free_ids.append(seq.partial.block_id)
        seq.length = 0
        seq.tail = []
        seq.hashes = []
        seq.partial = None

    def clear(self) -> bool:
        """Drop every cached block and emit ``KvCleared``; refused (False) while blocks are in use."""
        if self.active_blocks:
            return False
        self.retention.clear()
        for h in self._inactive:
            self._free_ids.append(self._full.pop(h))
        self._inactive.clear()
        self._lru_epoch += 1
        self._emit(KvCleared(self._event_id()))
        return True

    def drain_events(self) -> list[KvEvent]:
        """Events collected by the default sink since the last drain."""
        out = list(self.pending_events)
        self.pending_events.clear()
        return out

    # -- internals ------------------------------------------------------------------------------

    def _one_holder_less(self, hashes: list[int], others: list[int]) -> None:
        """A holder left ``hashes``, which ``others`` other holders each still hold (0: none, it went inactive)."""
        shared = self._shared
        still = list(map(gt, others, repeat(1)))  # 2+ others: still shared after this one leaves
        shared.update(zip(compress(hashes, still), map(sub, compress(others, still), repeat(1)), strict=True))
        deque(map(shared.__delitem__, compress(hashes, map(eq, others, repeat(1)))), maxlen=0)

    def _ref(self, block_hash: int) -> None:
        if block_hash in self._inactive:
            lease = self._inactive.pop(block_hash)
            if lease is MARK or lease > NO_LEASE:  # an adopted twin keeps its lease while in use
                self.retention.active[block_hash] = lease
            if block_hash in self._watch:
                self._void_probe()
        else:
            self._shared[block_hash] = self._shared.get(block_hash, 0) + 1

    def _take_block_id(self, removed: list[int]) -> int:
        if self._free_ids:
            return self._free_ids.pop()
        if self.retention.used:
            return self._take_block_ids(1, removed)[0]
        if not self.cached_blocks:
            raise KeyError("no free or inactive block left")  # callers check available_blocks first
        lru = self._lru  # its oldest end: a detached run (the newest end) may stay
        victim = next(iter(lru))
        del lru[victim]
        if victim in self._watch:
            self._void_probe()
        removed.append(victim)
        return self._full.pop(victim)

    def _take_block_ids(self, count: int, removed: list[int]) -> list[int]:
        """:meth:`_take_block_id` ``count`` times, in bulk: the free list first (last freed first), then the
        least recently used inactive blocks, evicted in LRU order."""
        free_ids = self._free_ids
        spare = min(count, len(free_ids))
        ids = free_ids[len(free_ids) - spare:][::-1]
        del free_ids[len(free_ids) - spare:]
        evict = count - spare
        if evict:
            if evict > self.cached_blocks:
                raise KeyError("no free or inactive block left")  # callers check available_blocks first
            lru = self._lru  # its oldest end: a detached run (the newest end) may stay
            if self.retention.used:  # passed-over leased blocks moved: probes look again
                victims, moved = self.retention.victims(self._inactive, evict)
                self._lru_epoch += moved
            else:
                victims = list(islice(lru, evict))
            deque(map(lru.pop, victims), maxlen=0)
            if self._watch and not self._watch.isdisjoint(victims):
                self._void_probe()
            removed.extend(victims)
            ids.extend(map(self._full.pop, victims))
        return ids

    def _fill(self, seq: KvSequence, token_ids: Sequence[int], removed: list[int],
              runs: list[tuple[int | None, list[StoredBlock]]]) -> None:
        """``seq`` grows by ``token_ids``: block by block, take a block and seal it once it is full (hash it and
        cache it, or adopt the cached twin); evicted hashes go to ``removed``, newly cached blocks to ``runs``."""
        bs = self.block_size
        start = seq.length
        end = seq.length = start + len(token_ids)
        base = len(seq.hashes) * bs  # where the old tail starts
        if not self._fill_new(seq, end, removed, runs):
            seq.partial = self._fill_each(seq, token_ids, start, end, removed, runs)
        if len(seq.hashes) * bs == base:
            seq.tail.extend(token_ids)
        else:  # a block was sealed: the new tail starts inside ``token_ids``
            seq.tail = list(token_ids[len(seq.hashes) * bs - start :])

    def _fill_new(self, seq: KvSequence, end: int, removed: list[int],
                  runs: list[tuple[int | None, list[StoredBlock]]]) -> bool:
        """:meth:`_fill_each` in bulk when the blocks it seals all have known hashes, none cached (so no twin
        is adopted and no block returns to the free list between two takes: the takes come first, in order,
        then the seals); False (nothing done) otherwise. A prompt's uncached chunk, the common case."""
        bs = self.block_size
        first, last = len(seq.hashes), end // bs
        if last - first < 2 or last > len(seq.known):
            return False
        new = seq.known[first:last]
        full = self._full
        if any(map(full.__contains__, new)) or len(set(new)) != len(new):
            return False
        old = seq.partial
        fresh = len(new) - (0 if old is None else 1)  # blocks taken to be sealed; one more for a new partial block
        ids = self._take_block_ids(fresh + (1 if end % bs else 0), removed)
        sealed_ids = ids[:fresh] if old is None else [old.block_id, *ids[:fresh]]
        full.update(zip(new, sealed_ids, strict=True))
        runs.append((seq.hashes[-1] if seq.hashes else None, stored_blocks(new, sealed_ids, bs)))
        seq.hashes.extend(new)
        seq.partial = PartialBlock(ids[-1]) if end % bs else None
        return True

    def _fill_each(self, seq: KvSequence, token_ids: Sequence[int], start: int, end: int, removed: list[int],
                   runs: list[tuple[int | None, list[StoredBlock]]]) -> PartialBlock | None:
        """:meth:`_fill` block by block (the hot loop of a decode's block, hence its locals); returns the new
        partial block."""
        bs = self.block_size
        full, free_ids, known, hashes = self._full, self._free_ids, seq.known, seq.hashes
        block = seq.partial
        while True:
            if block is None:
                block = PartialBlock(free_ids.pop() if free_ids else self._take_block_id(removed))
            index = len(hashes)
            if end < (index + 1) * bs:
                break
            parent = hashes[-1] if hashes else None
            h = known[index] if index < len(known) else self._hash_block(seq, token_ids, start, parent)
            hashes.append(h)
            if h in full:  # a cached twin: adopted, the private block goes back
                free_ids.append(block.block_id)
                self._ref(h)
            else:
                full[h] = block.block_id
                stored = StoredBlock(h, block.block_id, bs)
                if runs and runs[-1][1][-1].block_hash == parent:
                    runs[-1][1].append(stored)
                else:
                    runs.append((parent, [stored]))
            block = None
            if end == (index + 1) * bs:
                break
        return block

    def _hash_block(self, seq: KvSequence, token_ids: Sequence[int], start: int, parent: int | None) -> int:
        """The chained hash of ``seq``'s next full block (``seq.hashes`` are the ones before it), not known yet:
        computed once, kept in ``known``. Its tokens are the old tail's (that ended at ``start``) then
        ``token_ids``'s."""
        bs = self.block_size
        first = len(seq.hashes) * bs
        if first < start:  # the block the old tail began
            tokens = [*seq.tail, *token_ids[: first + bs - start]]
        else:
            tokens = list(token_ids[first - start : first - start + bs])
        (local,) = local_block_hashes(tokens, bs, seq.seed)
        h = chain(parent, local)
        seq.known.append(h)  # index == len(known): ``hashes`` is a prefix of ``known``
        return h

    def _event_id(self) -> int:
        event_id = self._next_event_id
        self._next_event_id += 1
        return event_id

    def _emit(self, event: KvEvent) -> None:
        self._on_event(event)
