"""``BlockManager`` / ``KvSequence`` against a deliberately simple reference model (hypothesis).

The model (:class:`_Model`) keeps the cache block by block, the way the module docstring of
``services.kvcore.block_manager`` describes it: a LIFO free-id list (ids 0, 1, 2, ... handed out first), a
dict of cached full blocks keyed by chained hash (``services.common.block_hash.sequence_hashes``) with
their block ids and ref counts, and an ``OrderedDict`` LRU of the inactive ones. Sequences hold their full
blocks' hashes and the id of a private partial block. Nothing is remembered between calls (no probe
memo, no bulk paths): every answer is recomputed from the tokens.

Generated operation sequences follow the scheduler's usage (``services.kvcore.scheduler``): a sequence's
token stream only grows; ``acquire_prefix`` only on an empty sequence (a non-empty one is first checked
to refuse, then preempted: freed and re-acquired with the same or a longer stream); ``probe_prefix``
(of an empty, waiting sequence) is followed by nothing, by ``touch_prefix`` with the matched count or by
``acquire_prefix``; ``append`` feeds the stream's next tokens (a prefill chunk, a decode token, or more);
``extend_partial`` only tokens that stay in the partial block; a finished request is freed and replaced
by a new sequence whose stream may share a prefix with another's. Small block sizes, capacities and token
alphabets make prefix sharing, twins (a block filling up into an already-cached hash), eviction,
capacity refusal, preemption, salts and ``clear`` frequent.

After every operation the test compares return values, the exact emitted events, the block accounting,
``lru_order()``, the ref count of every hash involved and each sequence's public state.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common.block_hash import sequence_hashes
from services.kvcore.block_manager import BlockManager, KvSequence
from services.kvcore.domain import KvCleared, KvEvent, KvRemoved, KvStored, StoredBlock

SLOTS = 4  # concurrent sequences (requests) in one scenario


# -- the reference model ---------------------------------------------------------------------------


@dataclass
class _Seq:
    """One request in the model: its token stream (only grows) and the blocks it holds."""

    salt: str
    stream: list[int]
    length: int = 0                                     # tokens whose KV it holds
    hashes: list[int] = field(default_factory=list)     # its full blocks, in order
    partial: int | None = None                          # block id of its private partial block

    @property
    def empty(self) -> bool:
        return self.length == 0


class _Model:
    """The block manager as its docstring describes it, one block at a time."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.bs = block_size
        self.free_ids = list(range(num_blocks - 1, -1, -1))  # pop() from the end: 0 first
        self.block_id: dict[int, int] = {}  # hash -> block id, every cached full block (active or inactive)
        self.refs: dict[int, int] = {}      # hash -> sequences referencing it
        self.lru: OrderedDict[int, None] = OrderedDict()  # inactive full blocks, least recently used first
        self.next_event_id = 1
        self.events: list[KvEvent] = []

    # -- helpers

    def stream_hashes(self, seq: _Seq, n_tokens: int | None = None) -> list[int]:
        tokens = seq.stream if n_tokens is None else seq.stream[:n_tokens]
        return sequence_hashes(tokens, self.bs, seq.salt)

    def _reusable(self, seq: _Seq) -> list[int]:
        """The hashes acquire_prefix may reuse: every full block of the stream but the one with its last token."""
        limit = max(0, (len(seq.stream) - 1) // self.bs)
        return self.stream_hashes(seq)[:limit]

    def _cached_prefix(self, hashes: list[int]) -> list[int]:
        out: list[int] = []
        for h in hashes:
            if h not in self.block_id:
                break
            out.append(h)
        return out

    def _event_id(self) -> int:
        self.next_event_id += 1
        return self.next_event_id - 1

    def _ref(self, h: int) -> None:
        if self.refs[h] == 0:
            del self.lru[h]
        self.refs[h] += 1

    def _unref(self, h: int) -> None:
        self.refs[h] -= 1
        if self.refs[h] == 0:
            self.lru[h] = None  # most recently used

    def _take(self, removed: list[int]) -> int:
        if self.free_ids:
            return self.free_ids.pop()
        victim, _ = self.lru.popitem(last=False)
        del self.refs[victim]
        removed.append(victim)
        return self.block_id.pop(victim)

    def drain(self) -> list[KvEvent]:
        out, self.events = self.events, []
        return out

    # -- accounting

    @property
    def available(self) -> int:
        return len(self.free_ids) + len(self.lru)

    def active_blocks(self, seqs: list[_Seq]) -> int:
        """Counted directly: distinct referenced full blocks plus the partial blocks."""
        return sum(1 for r in self.refs.values() if r > 0) + sum(s.partial is not None for s in seqs)

    # -- operations

    def match_prefix(self, seq: _Seq) -> int:
        return len(self._cached_prefix(self.stream_hashes(seq)))

    def probe(self, seq: _Seq) -> tuple[int, int]:
        prefix = self._cached_prefix(self._reusable(seq))
        return len(prefix), sum(h in self.lru for h in prefix)

    def touch(self, seq: _Seq, matched: int) -> None:
        """As acquiring the first ``matched`` blocks and freeing them again would: the inactive ones become
        the most recently used, the last block first, the first block last."""
        for h in reversed(self.stream_hashes(seq)[:matched]):
            if h in self.lru:
                self.lru.move_to_end(h)

    def acquire(self, seq: _Seq) -> int:
        assert seq.empty
        prefix = self._cached_prefix(self._reusable(seq))
        for h in prefix:
            self._ref(h)
        seq.hashes = prefix
        seq.length = len(prefix) * self.bs
        return seq.length

    def blocks_needed(self, seq: _Seq, n_tokens: int) -> int:
        """Blocks not allocated yet among those the tokens ``[length, length + n)`` land in."""
        first_unallocated = -(-seq.length // self.bs)
        last = -(-(seq.length + n_tokens) // self.bs)
        return max(0, last - first_unallocated)

    def append(self, seq: _Seq, n_tokens: int) -> bool:
        if self.blocks_needed(seq, n_tokens) > self.available:
            return False
        bs = self.bs
        end = seq.length + n_tokens
        hashes = self.stream_hashes(seq, end)
        removed: list[int] = []
        stored: list[tuple[int | None, StoredBlock]] = []
        pos = seq.length
        while pos < end:
            if seq.partial is None:  # the block the next token goes into, taken before its hash is known
                seq.partial = self._take(removed)  # (may evict its own twin: see the last test)
            block_end = (pos // bs + 1) * bs
            if end < block_end:
                break
            # the partial block is full: seal it
            index = pos // bs
            h = hashes[index]
            parent = seq.hashes[-1] if seq.hashes else None
            seq.hashes.append(h)
            if h in self.block_id:  # a twin: adopt the cached block, free this one (no event)
                self.free_ids.append(seq.partial)
                self._ref(h)
            else:
                self.block_id[h] = seq.partial
                self.refs[h] = 1
                stored.append((parent, StoredBlock(h, seq.partial, bs)))
            seq.partial = None
            pos = block_end
        seq.length = end
        if removed:
            self.events.append(KvRemoved(self._event_id(), tuple(removed)))
        runs: list[tuple[int | None, list[StoredBlock]]] = []
        for parent, block in stored:  # one event per run of consecutive blocks (each the child of the last)
            if runs and runs[-1][1][-1].block_hash == parent:
                runs[-1][1].append(block)
            else:
                runs.append((parent, [block]))
        for parent, blocks in runs:
            self.events.append(KvStored(self._event_id(), parent, tuple(blocks)))
        return True

    def extend_partial(self, seq: _Seq, n_tokens: int) -> None:
        assert seq.partial is not None and seq.length % self.bs + n_tokens < self.bs
        seq.length += n_tokens

    def free(self, seq: _Seq) -> None:
        for h in reversed(seq.hashes):  # into the LRU list tail first
            self._unref(h)
        if seq.partial is not None:
            self.free_ids.append(seq.partial)
        seq.length, seq.hashes, seq.partial = 0, [], None

    def clear(self, seqs: list[_Seq]) -> bool:
        if self.active_blocks(seqs):
            return False
        for h in self.lru:
            self.free_ids.append(self.block_id.pop(h))
            del self.refs[h]
        self.lru.clear()
        self.events.append(KvCleared(self._event_id()))
        return True

    def self_check(self, seqs: list[_Seq]) -> None:
        """The model's own invariants (so that agreeing with it means agreeing with the docstring)."""
        assert set(self.block_id) == set(self.refs)
        assert list(self.lru) == [h for h in self.lru if self.refs[h] == 0]
        assert {h for h, r in self.refs.items() if r == 0} == set(self.lru)
        for h, r in self.refs.items():
            assert r == sum(s.hashes.count(h) for s in seqs)
        ids = [*self.free_ids, *self.block_id.values(), *(s.partial for s in seqs if s.partial is not None)]
        assert sorted(ids) == list(range(self.num_blocks))  # every block exactly one of free/cached/partial
        for s in seqs:
            assert len(s.hashes) == s.length // self.bs and (s.partial is None) == (s.length % self.bs == 0)
            assert s.hashes == self.stream_hashes(s, s.length)[: len(s.hashes)]


# -- operations --------------------------------------------------------------------------------------


class New(NamedTuple):
    """The request in ``slot`` finished (freed); a new one starts, its stream ``src``'s first ``cut`` tokens +
    ``extra``, with ``salt`` (None: ``src``'s); ``seeded``: its known hashes are passed in (as the router's)."""

    slot: int
    src: int
    cut: int
    extra: list[int]
    salt: str | None
    seeded: bool


class Acquire(NamedTuple):
    """(Re-)admit ``slot``: preempted first when it holds tokens; its stream grows by ``extra``."""

    slot: int
    extra: list[int]


class Probe(NamedTuple):
    """Probe ``slot`` (a waiting request: preempted first when it holds tokens), then maybe touch or acquire."""

    slot: int
    extra: list[int]
    then: Literal["none", "touch", "acquire"]


class Append(NamedTuple):
    """Hold KV for the next ``n_tokens`` tokens of ``slot``'s stream (which first grows by ``extra``)."""

    slot: int
    n_tokens: int
    extra: list[int]


class ExtendPartial(NamedTuple):
    """``extend_partial`` of the next ``n_tokens`` tokens; refused (ValueError, no change) when they do not fit."""

    slot: int
    n_tokens: int
    extra: list[int]


class Free(NamedTuple):
    slot: int


class Clear(NamedTuple):
    """``clear()``; with ``free_all`` every sequence is freed first (so it succeeds)."""

    free_all: bool


Op = New | Acquire | Probe | Append | ExtendPartial | Free | Clear


class Scenario(NamedTuple):
    num_blocks: int
    block_size: int
    sink: bool  # events to an ``on_event`` callback instead of ``pending_events`` / ``drain_events``
    ops: list[Op]


@st.composite
def _op(draw: st.DrawFn, alphabet: int) -> Op:
    slot = draw(st.integers(0, SLOTS - 1))
    tokens = st.lists(st.integers(0, alphabet - 1), max_size=8)
    roll = draw(st.integers(0, 99))  # the kinds' weights (shrinking towards a plain Free)
    if roll < 15:
        return Free(slot)
    if roll < 29:
        salt = draw(st.sampled_from([None, None, "", "t"]))
        return New(slot, draw(st.integers(0, SLOTS - 1)), draw(st.integers(0, 40)), draw(tokens), salt,
                   draw(st.booleans()))
    if roll < 36:
        return Acquire(slot, draw(tokens))
    if roll < 56:
        return Probe(slot, draw(tokens), draw(st.sampled_from(["none", "touch", "touch", "acquire"])))
    if roll < 76:  # a prefill chunk (or a few tokens)
        return Append(slot, draw(st.integers(1, 12)), draw(tokens))
    if roll < 88:  # a decode step
        return Append(slot, 1, draw(st.lists(st.integers(0, alphabet - 1), max_size=1)))
    if roll < 95:
        return ExtendPartial(slot, draw(st.integers(0, 3)), draw(tokens))
    return Clear(draw(st.booleans()))


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    block_size = draw(st.integers(1, 4))
    num_blocks = draw(st.integers(2, 12))
    alphabet = draw(st.integers(2, 3))
    # runs of operations: about 30 operations on average (a flat list's size is mostly small), and a failing
    # example still shrinks by deleting any operation
    runs = draw(st.lists(st.lists(_op(alphabet), min_size=1, max_size=10), min_size=1, max_size=12))
    ops = [op for run in runs for op in run]
    return Scenario(num_blocks, block_size, draw(st.booleans()), ops)


# -- the driver ----------------------------------------------------------------------------------------


class _Run:
    """One scenario on the real manager and on the model, compared after every operation."""

    def __init__(self, num_blocks: int, block_size: int, sink: bool) -> None:
        self.sunk: list[KvEvent] = []
        self.sink = sink
        self.bm = BlockManager(num_blocks, block_size, self.sunk.append if sink else None)
        self.model = _Model(num_blocks, block_size)
        self.seqs = [KvSequence() for _ in range(SLOTS)]
        self.mseqs = [_Seq("", []) for _ in range(SLOTS)]
        self.seen: set[int] = set()  # every hash any stream had: their ref counts are compared
        self.head: int | None = None  # the last probed slot: the head of the scheduler's waiting queue

    def events(self) -> list[KvEvent]:
        if self.sink:
            out, self.sunk[:] = list(self.sunk), []
            assert self.bm.pending_events == []
            return out
        return self.bm.drain_events()

    def free(self, i: int) -> None:
        self.bm.free(self.seqs[i])
        self.model.free(self.mseqs[i])

    def acquire(self, i: int) -> None:
        seq, m = self.seqs[i], self.mseqs[i]
        assert self.bm.acquire_prefix(seq, list(m.stream)) == self.model.acquire(m)

    def preempt_if_holding(self, i: int) -> None:
        seq, m = self.seqs[i], self.mseqs[i]
        if not m.empty:
            with pytest.raises(ValueError):
                self.bm.acquire_prefix(seq, list(m.stream))
            self.check()  # the refusal changed nothing
            self.free(i)

    def apply(self, op: Op) -> None:
        bm, model = self.bm, self.model
        match op:
            case New(slot, src, cut, extra, salt, seeded):
                stream = [*self.mseqs[src].stream[:cut], *extra]
                salt = self.mseqs[src].salt if salt is None else salt
                self.free(slot)
                known = sequence_hashes(stream, bm.block_size, salt) if seeded else None
                self.seqs[slot] = KvSequence(salt, known=known)
                self.mseqs[slot] = _Seq(salt, stream)
            case Acquire(slot, extra):
                self.preempt_if_holding(slot)
                self.mseqs[slot].stream.extend(extra)
                self.acquire(slot)
            case Probe(slot, extra, then):
                self.preempt_if_holding(slot)
                seq, m = self.seqs[slot], self.mseqs[slot]
                m.stream.extend(extra)
                probed = bm.probe_prefix(seq, list(m.stream))
                assert probed == model.probe(m)
                self.head = slot
                if then == "touch":
                    bm.touch_prefix(seq, probed[0])
                    model.touch(m, probed[0])
                elif then == "acquire":
                    self.acquire(slot)
            case Append(slot, n_tokens, extra):
                seq, m = self.seqs[slot], self.mseqs[slot]
                m.stream.extend(extra)
                tokens = m.stream[m.length : m.length + n_tokens]
                needed = model.blocks_needed(m, len(tokens))
                assert bm.blocks_needed(seq, len(tokens)) == needed
                assert bm.can_append(seq, len(tokens)) == (needed <= model.available)
                assert bm.append(seq, tokens) == model.append(m, len(tokens))
            case ExtendPartial(slot, n_tokens, extra):
                seq, m = self.seqs[slot], self.mseqs[slot]
                m.stream.extend(extra)
                tokens = m.stream[m.length : m.length + n_tokens]
                if m.partial is not None and m.length % bm.block_size + len(tokens) < bm.block_size:
                    bm.extend_partial(seq, tokens)
                    model.extend_partial(m, len(tokens))
                else:
                    with pytest.raises(ValueError):
                        bm.extend_partial(seq, tokens)
            case Free(slot):
                self.free(slot)
            case Clear(free_all):
                if free_all:
                    for i in range(SLOTS):
                        self.free(i)
                assert bm.clear() == model.clear(self.mseqs)

    def check(self) -> None:
        bm, model, bs = self.bm, self.model, self.bm.block_size
        model.self_check(self.mseqs)
        assert self.events() == model.drain()
        assert bm.free_blocks == len(model.free_ids)
        assert bm.cached_blocks == len(model.lru)
        assert bm.active_blocks == model.active_blocks(self.mseqs)
        assert bm.available_blocks == model.available
        assert bm.free_blocks + bm.cached_blocks + bm.active_blocks == bm.total_blocks
        assert bm.lru_order() == list(model.lru)
        for seq, m in zip(self.seqs, self.mseqs, strict=True):
            stream_hashes = model.stream_hashes(m)
            self.seen.update(stream_hashes)
            assert seq.salt == m.salt
            assert seq.length == m.length
            assert seq.hashes == m.hashes
            assert seq.num_blocks == len(m.hashes) + (m.partial is not None)
            assert (seq.partial is None) == (m.partial is None)
            assert seq.tail == m.stream[len(m.hashes) * bs : m.length]
            # ``known``: a prefix of the stream's chained hashes, ``hashes`` a prefix of it
            assert seq.known == stream_hashes[: len(seq.known)] and len(seq.known) >= len(seq.hashes)
            assert bm.match_prefix(m.stream, m.salt) == model.match_prefix(m)
        for h in self.seen | set(model.refs):
            assert bm.ref_count(h) == model.refs.get(h, 0), h
        if self.head is not None and self.mseqs[self.head].empty:
            # the scheduler probes the waiting head every step: its remembered probe must still hold
            m = self.mseqs[self.head]
            assert bm.probe_prefix(self.seqs[self.head], list(m.stream)) == model.probe(m)


def run_scenario(scenario: Scenario) -> None:
    run = _Run(scenario.num_blocks, scenario.block_size, scenario.sink)
    run.check()
    for op in scenario.ops:
        run.apply(op)
        run.check()
    # the end of the run: every request finishes, the cache is dropped
    for i in range(SLOTS):
        run.free(i)
    assert run.bm.clear() and run.model.clear(run.mseqs)
    run.check()
    assert run.bm.free_blocks == run.bm.total_blocks


@pytest.mark.timeout(600)  # passing takes a few seconds; shrinking a failure to a minimal example can take minutes
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_block_manager_matches_the_reference_model(scenario: Scenario) -> None:
    run_scenario(scenario)


def test_a_twin_evicted_by_its_own_allocation_is_stored_again() -> None:
    """Pinned current behaviour, which the model reproduces (it takes the block a token goes into before the
    block is full and its hash looked up).

    NOTE (reported, not changed): arguably at odds with the module docstring ("when a partial block fills up
    and its hash is already cached, the sequence adopts the cached block ... no duplicate, no event"; inactive
    blocks are evicted "only when an allocation needs room"). With no free block, an ``append`` that seals a
    block takes a block first, evicting the least recently used cached block, even when that block is the very
    twin it would adopt: the twin is removed (``KvRemoved``) and stored again (``KvStored``, same block id)
    instead of adopted silently. When the victim is another block, that one is evicted (``KvRemoved``) although
    no room was needed in the end, and its id ends up on the free list. ``can_append`` counts the same
    pessimistic need, so the accounting stays consistent: the cost is spurious events or a lost cached block."""
    bs = 2
    stream = [0, 1, 2, 3]
    h1, h2 = sequence_hashes(stream, bs)
    ops: list[Op] = [Append(0, 4, stream), Free(0), New(1, 0, 4, [], None, False), Acquire(1, []), Append(1, 2, [])]
    run_scenario(Scenario(2, bs, False, ops))  # the model does the same, step by step
    bm = BlockManager(2, bs)
    a = KvSequence()
    assert bm.append(a, stream)
    bm.free(a)
    assert bm.lru_order() == [h2, h1]
    bm.drain_events()
    b = KvSequence()
    assert bm.acquire_prefix(b, stream) == bs  # the last block is recomputed
    assert bm.append(b, stream[bs:])
    assert bm.drain_events() == [KvRemoved(2, (h2,)), KvStored(3, h1, (StoredBlock(h2, 1, bs),))]
