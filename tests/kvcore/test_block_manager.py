from __future__ import annotations

import pytest

from services.common.block_hash import sequence_hashes
from services.kvcore.block_manager import BlockManager, KvSequence
from services.kvcore.domain import KvCleared, KvRemoved, KvStored

BS = 4


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def fill(bm: BlockManager, token_ids: list[int], salt: str = "") -> tuple[KvSequence, int]:
    seq = KvSequence(salt)
    cached = bm.acquire_prefix(seq, token_ids)
    assert bm.append(seq, token_ids[cached:])
    return seq, cached


def test_stored_events_chain_parents_and_match_sequence_hashes() -> None:
    bm = BlockManager(16, BS)
    prompt = toks(1, 10)  # two full blocks + a partial one
    seq, cached = fill(bm, prompt)
    assert cached == 0
    events = bm.drain_events()
    assert len(events) == 1 and isinstance(events[0], KvStored)
    stored = events[0]
    assert stored.event_id == 1 and stored.parent_hash is None
    assert [b.block_hash for b in stored.blocks] == sequence_hashes(prompt, BS)
    assert all(b.token_count == BS for b in stored.blocks)
    assert bm.active_blocks == 3  # 2 full + 1 partial

    # decode fills the partial block: a Stored whose parent is the last stored block
    assert bm.append(seq, [11, 12])
    (ev,) = bm.drain_events()
    assert isinstance(ev, KvStored) and ev.event_id == 2
    assert ev.parent_hash == stored.blocks[-1].block_hash
    assert [b.block_hash for b in ev.blocks] == sequence_hashes(toks(1, 12), BS)[2:]
    assert bm.active_blocks == 3


def test_prefix_reuse_and_refcounts() -> None:
    bm = BlockManager(16, BS)
    a, _ = fill(bm, toks(1, 9))
    hashes = sequence_hashes(toks(1, 9), BS)
    b, cached = fill(bm, [*toks(1, 8), 99, 98])
    assert cached == 8
    assert [bm.ref_count(h) for h in hashes] == [2, 2]
    assert bm.active_blocks == 4  # 2 shared full blocks + 2 private partial blocks
    bm.free(a)
    assert [bm.ref_count(h) for h in hashes] == [1, 1]
    bm.free(b)
    assert bm.active_blocks == 0 and bm.cached_blocks == 2
    # reuse from inactive blocks
    _c, cached = fill(bm, toks(1, 9))
    assert cached == 8 and bm.cached_blocks == 0


def test_fully_cached_prompt_still_computes_one_token() -> None:
    bm = BlockManager(16, BS)
    a, _ = fill(bm, toks(1, 8))
    bm.free(a)
    bm.drain_events()
    b = KvSequence()
    assert bm.acquire_prefix(b, toks(1, 8)) == 4  # the last block is recomputed
    assert bm.append(b, toks(5, 4))  # its cached twin is adopted: no duplicate, no event
    assert bm.drain_events() == []
    assert bm.active_blocks == 2


def test_salt_changes_hashes() -> None:
    bm = BlockManager(16, BS)
    fill(bm, toks(1, 8))
    _, cached = fill(bm, [*toks(1, 8), 0], salt="tenant-b")
    assert cached == 0


def test_lru_eviction_order_and_removed_events() -> None:
    bm = BlockManager(4, BS)
    a, _ = fill(bm, toks(100, 8))   # blocks A1 A2
    b, _ = fill(bm, toks(200, 8))   # blocks B1 B2
    ha, hb = sequence_hashes(toks(100, 8), BS), sequence_hashes(toks(200, 8), BS)
    bm.free(a)
    bm.free(b)
    # freed tail-first, oldest request first: A2, A1, B2, B1
    assert bm.lru_order() == [ha[1], ha[0], hb[1], hb[0]]
    bm.drain_events()
    c, _ = fill(bm, toks(300, 8))
    events = bm.drain_events()
    assert isinstance(events[0], KvRemoved) and events[0].block_hashes == (ha[1], ha[0])
    assert isinstance(events[1], KvStored)
    assert [e.event_id for e in events] == [3, 4]
    assert bm.lru_order() == [hb[1], hb[0]]
    # touching B's prefix makes it most recently used; C's tail goes first
    bm.free(c)
    assert bm.lru_order()[-2:] == sequence_hashes(toks(300, 8), BS)[::-1]


def test_capacity_exhaustion_changes_nothing() -> None:
    bm = BlockManager(3, BS)
    a, _ = fill(bm, toks(1, 8))
    seq = KvSequence()
    assert bm.blocks_needed(seq, 8) == 2
    assert not bm.append(seq, toks(50, 8))
    assert seq.length == 0 and seq.tail == [] and bm.active_blocks == 2 and bm.free_blocks == 1
    assert bm.append(seq, toks(50, 4))
    assert not bm.append(a, [9])  # growing also fails cleanly
    assert bm.active_blocks == 3


def test_clear_only_when_idle() -> None:
    bm = BlockManager(8, BS)
    a, _ = fill(bm, toks(1, 8))
    assert not bm.clear()
    bm.free(a)
    bm.drain_events()
    assert bm.clear()
    (ev,) = bm.drain_events()
    assert isinstance(ev, KvCleared) and ev.event_id == 2
    assert bm.cached_blocks == 0 and bm.free_blocks == 8
    assert bm.match_prefix(toks(1, 8)) == 0


def test_event_ids_are_consecutive_across_kinds() -> None:
    bm = BlockManager(2, BS)
    for start in (0, 100, 200, 300):
        seq, _ = fill(bm, toks(start, 8))
        bm.free(seq)
    bm.clear()
    ids = [e.event_id for e in bm.drain_events()]
    assert ids == list(range(1, len(ids) + 1))


def test_invalid_sizes() -> None:
    with pytest.raises(ValueError):
        BlockManager(0, 16)


def _lru_state(bm: BlockManager) -> tuple[list[int], int, int]:
    return bm.lru_order(), bm.free_blocks, bm.cached_blocks


def test_probe_and_touch_leave_the_cache_as_acquire_and_free_would() -> None:
    """A waiting request that does not fit: probing + touching == taking its prefix and freeing it."""
    def scenario() -> tuple[BlockManager, KvSequence, list[int]]:
        bm = BlockManager(12, BS)
        prompt = toks(1, 17)
        a, _ = fill(bm, prompt)
        other, _ = fill(bm, toks(100, 9))
        bm.free(a)          # the prompt's blocks are cached, inactive
        bm.free(other)      # and are older than these in LRU order
        fill(bm, toks(200, 8))  # something active
        return bm, KvSequence(), [*prompt, 99]

    bm1, seq1, p = scenario()
    cached = bm1.acquire_prefix(seq1, p)
    bm1.free(seq1)
    bm2, seq2, _ = scenario()
    matched, idle = bm2.probe_prefix(seq2, p)
    assert matched * BS == cached and idle == matched
    bm2.touch_prefix(seq2, matched)
    assert _lru_state(bm2) == _lru_state(bm1)
    assert bm2.probe_prefix(seq2, p) == (matched, idle)  # remembered: nothing moved
    bm2.touch_prefix(seq2, matched)
    assert _lru_state(bm2) == _lru_state(bm1)
    # something enters the LRU list after the touch: the next touch moves the prefix behind it again
    for bm in (bm1, bm2):
        extra, _ = fill(bm, toks(300, 4))
        bm.free(extra)
    bm1.acquire_prefix(seq1, p)
    bm1.free(seq1)
    assert bm2.probe_prefix(seq2, p) == (matched, idle)
    bm2.touch_prefix(seq2, matched)
    assert _lru_state(bm2) == _lru_state(bm1)
    # evictions reach its blocks: the remembered probe sees them
    for n in range(10):
        s1, s2 = KvSequence(), KvSequence()
        assert bm1.append(s1, toks(500 + 100 * n, BS)) == bm2.append(s2, toks(500 + 100 * n, BS))
        assert bm2.probe_prefix(seq2, p) == bm1.probe_prefix(KvSequence(), p)
    assert bm2.probe_prefix(seq2, p)[0] < matched


def test_a_sequence_hashes_its_stream_once() -> None:
    bm = BlockManager(16, BS)
    prompt = toks(1, 10)
    seq, _ = fill(bm, prompt)
    assert seq.known == sequence_hashes(prompt, BS)
    assert bm.append(seq, [11, 12, 13])
    stream = [*prompt, 11, 12, 13]
    assert seq.known == sequence_hashes(stream, BS) == seq.hashes
    known = seq.known
    bm.free(seq)  # preempted: the hashes stay with the sequence
    assert seq.known is known and seq.hashes == []
    assert bm.acquire_prefix(seq, stream) == 12
    assert bm.append(seq, stream[12:])
    assert seq.hashes == sequence_hashes(stream, BS) and seq.known is known
    seeded = KvSequence(known=sequence_hashes(stream, BS))  # hashes a caller already had
    assert bm.acquire_prefix(seeded, stream) == 12


@pytest.mark.parametrize("first_difference", [0, 1, 2, 63, 64, 1000, 2999, 3000, 4999, None])
def test_common_prefix_of_hash_lists_finds_the_first_difference(first_difference: int | None) -> None:
    from services.common.sequences import common_prefix

    a = list(range(10**12, 10**12 + 5000))
    b = [int(str(x)) for x in a]  # equal values, other objects: the compare may not rely on identity
    if first_difference is not None:
        b[first_difference] += 1
    assert common_prefix(a, b) == (5000 if first_difference is None else first_difference)
    assert common_prefix(a, b[:3000]) == min(3000, 5000 if first_difference is None else first_difference)


def test_a_next_turn_takes_its_previous_turns_run_and_the_list_reads_as_if_popped() -> None:
    """An admission that takes the LRU list's newest run (a session's next turn) leaves that run in place
    until the list is next used; meanwhile every reading of the list, and evictions from its oldest end,
    are what popping it at once would give."""
    bm = BlockManager(12, BS)
    other, _ = fill(bm, toks(500, 3 * BS))             # 3 blocks, freed first: the oldest entries
    bm.free(other)
    turn = toks(1, 5 * BS + 1)                         # 5 full blocks and one token
    first, _ = fill(bm, turn)
    bm.free(first)                                     # its 5 blocks are now the newest entries
    ours, theirs = sequence_hashes(turn, BS), sequence_hashes(toks(500, 3 * BS), BS)
    assert bm.lru_order() == [*reversed(theirs), *reversed(ours)]
    bm.drain_events()

    nxt = KvSequence()
    stream = [*turn, *toks(900, 5 * BS)]               # the next turn: the same 5 blocks, 5 new ones, one token
    assert bm.probe_prefix(nxt, stream) == (5, 5)
    assert bm.acquire_prefix(nxt, stream) == 5 * BS
    assert bm.lru_order() == list(reversed(theirs)) and bm.cached_blocks == 3
    assert [bm.ref_count(h) for h in ours] == [1] * 5 and bm.active_blocks == 5
    # 6 more blocks with 4 free: 2 evicted from the oldest end while the taken run is still in the dict
    assert bm.append(nxt, stream[5 * BS:])
    removed = [e for e in bm.drain_events() if isinstance(e, KvRemoved)]
    assert [h for e in removed for h in e.block_hashes] == list(reversed(theirs))[:2]
    assert bm.lru_order() == list(reversed(theirs))[2:] and bm.cached_blocks == 1
    assert bm.free_blocks == 0 and bm.active_blocks == 11

    bm.free(nxt)                                       # the list is used again: the run leaves it first
    assert bm.lru_order() == [*list(reversed(theirs))[2:], *reversed(sequence_hashes(stream, BS))]
    assert bm.cached_blocks == 11 and bm.active_blocks == 0
