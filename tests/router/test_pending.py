"""The pending-prefix index: predictions from placements, their expiry, replacement by events, cancellation,
and what they do to placement (siblings sent together land together; nothing changes once they are gone)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.block_hash import sequence_hashes
from services.router.index import ClearedEvent, KvIndex, RemovedEvent, StoredEvent
from services.router.pending import PendingPrefixes, _count, _uncount
from services.router.policy import DEFAULT_OVERLAP_WEIGHT, PlacementPolicy
from services.router.registry import WorkerEndpoint, WorkerLoad, WorkerRegistry
from services.router.router import InFlight, Router

BS = 16


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def hashes(n_blocks: int, start: int = 0) -> list[int]:
    return sequence_hashes(list(range(start, start + n_blocks * BS)), BS)


def sibling(shared_blocks: int, own_blocks: int, k: int) -> list[int]:
    """A prompt: ``shared_blocks`` blocks every sibling has, then ``own_blocks`` of its own."""
    return list(range(shared_blocks * BS)) + [100_000 * (k + 1) + i for i in range(own_blocks * BS)]


def make_router(workers: int = 4, ttl: float | None = 3.0, clock: Clock | None = None,
                weight: float = DEFAULT_OVERLAP_WEIGHT) -> Router:
    registry = WorkerRegistry(timeout=5.0)
    for i in range(workers):
        registry.heartbeat(WorkerEndpoint(f"w{i}", f"127.0.0.1:{1000 + i}", BS, 16384))
    pending = PendingPrefixes(ttl, clock or Clock()) if ttl is not None else None
    return Router(KvIndex(), registry, PlacementPolicy("kv", weight), pending=pending)


def place_and_begin(router: Router, prompt: list[int]) -> tuple[str, InFlight]:
    placement = router.place(prompt)
    best = placement.candidates[0]
    return best.worker_id, router.begin(best.worker_id, placement, best)


# -- the index alone ----------------------------------------------------------------------------------------


def test_a_placement_predicts_its_blocks_past_what_the_index_showed() -> None:
    pending = PendingPrefixes(3.0, Clock())
    blocks = hashes(10)
    pending.add("w0", blocks, cached=4, overlap=4)
    assert pending.predicted_blocks("w0") == 6
    assert pending.computing_blocks("w0") == 6
    # Another request sharing the first 8 blocks; the worker's index shows the first 4.
    other = [*blocks[:8], *hashes(2, start=5000)]
    match = pending.match("w0", other, cached=4, holds=set(blocks[:4]))
    assert (match.predicted, match.shared) == (4, 4)
    assert pending.match("w1", other, cached=0, holds=set()).predicted == 0


def test_overlap_counting_walks_predicted_and_cached_blocks_in_order_and_stops_at_the_first_gap() -> None:
    pending = PendingPrefixes(3.0, Clock())
    blocks = hashes(10)
    pending.add("w0", blocks[:3], cached=0, overlap=0)
    # Blocks 3-4 are cached (events arrived), 5 is neither: the walk stops there.
    match = pending.match("w0", blocks, cached=0, holds={blocks[3], blocks[4], blocks[7]})
    assert match.predicted == 5
    assert match.shared == 3   # only the blocks the in-flight request computes


def test_predictions_last_while_prefilling_then_expire_ttl_after_the_first_frame() -> None:
    clock = Clock()
    pending = PendingPrefixes(3.0, clock)
    blocks = hashes(8)
    entry = pending.add("w0", blocks, cached=0, overlap=0)
    clock.now += 60  # a long queue on the worker: still prefilling, still predicted
    pending.expire()
    assert pending.predicted_blocks("w0") == 8
    pending.prefill_done(entry)
    assert pending.computing_blocks("w0") == 0
    assert pending.match("w0", blocks, 0, set()).predicted == 8
    clock.now += 2.9
    pending.expire()
    assert pending.predicted_blocks("w0") == 8
    clock.now += 0.2
    pending.expire()
    assert pending.predicted_blocks("w0") == 0
    assert pending.match("w0", blocks, 0, set()).predicted == 0


def test_the_workers_events_replace_predictions() -> None:
    pending = PendingPrefixes(3.0, Clock())
    blocks = hashes(8)
    entry = pending.add("w0", blocks, cached=0, overlap=0)
    pending.on_events("w0", [StoredEvent(1, tuple(blocks[:5]))])
    assert pending.predicted_blocks("w0") == 3
    pending.on_events("w0", [RemovedEvent(2, (blocks[6],))])  # evicted: no longer predicted either
    assert pending.predicted_blocks("w0") == 2
    pending.drop(entry)   # ending the entry later takes back only what is left
    assert pending.predicted_blocks("w0") == 0
    again = pending.add("w0", blocks, cached=0, overlap=0)
    pending.on_events("w0", [ClearedEvent(3)])
    assert pending.predicted_blocks("w0") == 0
    assert pending.computing_blocks("w0") == 8  # the router's own prefill book-keeping is not the worker's
    pending.drop(again)
    assert pending.computing_blocks("w0") == 0


def test_a_request_that_ends_before_its_first_frame_drops_its_prediction() -> None:
    pending = PendingPrefixes(3.0, Clock())
    blocks = hashes(8)
    first = pending.add("w0", blocks, cached=0, overlap=0)
    second = pending.add("w0", blocks, cached=0, overlap=8)  # a sibling reusing all of it
    pending.drop(first)
    assert pending.predicted_blocks("w0") == 8     # the sibling still predicts them
    assert pending.computing_blocks("w0") == 0
    pending.drop(second)
    pending.drop(second)  # idempotent
    assert pending.predicted_blocks("w0") == 0


def test_inflight_release_before_the_first_frame_drops_after_it_keeps() -> None:
    clock = Clock()
    pending = PendingPrefixes(3.0, clock)
    blocks = hashes(8)
    failed = InFlight(WorkerLoad(), 8, 8, (pending, pending.add("w0", blocks, 0, 0)))
    failed.release()
    assert pending.predicted_blocks("w0") == 0
    done = InFlight(WorkerLoad(), 8, 8, (pending, pending.add("w0", blocks, 0, 0)))
    done.prefill_done()
    done.release()
    assert pending.predicted_blocks("w0") == 8
    clock.now += 3.0
    pending.expire()
    assert pending.predicted_blocks("w0") == 0


def test_a_worker_that_leaves_takes_its_predictions_along() -> None:
    pending = PendingPrefixes(3.0, Clock())
    blocks = hashes(8)
    old = pending.add("w0", blocks, 0, 0)
    pending.remove_worker("w0")
    assert pending.predicted_blocks("w0") == 0
    pending.add("w0", blocks, 0, 0)   # it came back
    pending.drop(old)                  # the old entry does not touch the new state
    assert pending.predicted_blocks("w0") == 8


def test_ttl_must_be_positive() -> None:
    with pytest.raises(ValueError, match="ttl"):
        PendingPrefixes(0.0)


# -- placement ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("ttl", "expected_workers"), [(3.0, 1), (None, 4)])
def test_siblings_sent_together_land_on_one_worker_only_with_the_index(
        ttl: float | None, expected_workers: int) -> None:
    router = make_router(ttl=ttl)
    # ~10k tokens, 93 % shared: 581 shared blocks, 44 of each sibling's own.
    placed = [place_and_begin(router, sibling(581, 44, k))[0] for k in range(4)]
    assert len(set(placed)) == expected_workers


def test_siblings_still_land_together_once_the_first_ones_events_arrived_mid_prefill() -> None:
    router = make_router()
    first, _ = place_and_begin(router, sibling(581, 44, 0))
    # The engine published the blocks it scheduled so far (it is still prefilling).
    router.on_kv_events(first, [StoredEvent(1, tuple(sequence_hashes(sibling(581, 44, 0), BS)[:512]))])
    assert router.pending is not None and router.pending.predicted_blocks(first) == 625 - 512
    placement = router.place(sibling(581, 44, 1))
    best = placement.candidates[0]
    assert best.worker_id == first
    assert (best.overlap_blocks, best.predicted_blocks) == (581, 69)


def test_a_large_group_spreads_once_its_kv_outweighs_the_prefill_it_saves() -> None:
    router = make_router()
    placed = [place_and_begin(router, sibling(581, 44, k))[0] for k in range(16)]
    counts = sorted((placed.count(w) for w in set(placed)), reverse=True)
    # 581 shared + 44 own blocks at weight 8, on 16,384-block workers (the router README): the KV term grows with
    # the square of the share of capacity held, so eight siblings (5,000 blocks counted) fit before it spreads
    assert counts == [8, 8], counts


def test_a_failed_first_sibling_no_longer_attracts_the_others() -> None:
    router = make_router()
    _, held = place_and_begin(router, sibling(581, 44, 0))
    held.release()  # cancelled before its first frame
    placement = router.place(sibling(581, 44, 1))
    assert all(c.overlap_blocks == 0 for c in placement.candidates)


def test_once_predictions_expire_placement_is_what_it_is_without_the_index() -> None:
    clock = Clock()
    with_index, without = make_router(clock=clock), make_router(ttl=None)
    for router in (with_index, without):
        _, held = place_and_begin(router, sibling(100, 20, 0))
        held.prefill_done()
        held.release()
    clock.now += 3.0
    for k in range(1, 6):
        a, b = with_index.place(sibling(100, 20, k)), without.place(sibling(100, 20, k))
        assert a.candidates == b.candidates


def test_predicted_blocks_are_reported_per_candidate() -> None:
    router = make_router(workers=2)
    first, _ = place_and_begin(router, sibling(50, 10, 0))
    placement = router.place(sibling(50, 10, 1))
    best = placement.candidates[0]
    assert (best.worker_id, best.overlap_blocks, best.predicted_blocks, best.new_blocks) == (first, 50, 50, 10)
    assert all(c.predicted_blocks == 0 for c in placement.candidates[1:])


def test_shared_blocks_leave_only_the_workers_prefill_in_flight_never_more() -> None:
    policy = PlacementPolicy("kv", 8.0)
    loads = {"a": WorkerLoad(requests=1, active_blocks=100, prefill_blocks=30), "b": WorkerLoad()}
    plain = policy.rank(100, {"a": 90, "b": 0}, loads)
    discounted = policy.rank(100, {"a": 90, "b": 0}, loads, predicted={"a": 90}, shared={"a": 500})
    cost = {c.worker_id: c.cost for c in plain}
    assert cost == {"a": 8 * (30 + 10) + 200, "b": 8 * 100 + 100}
    assert {c.worker_id: c.cost for c in discounted} == {"a": 8 * (0 + 10) + 200, "b": 8 * 100 + 100}
    assert discounted[0].predicted_blocks == 90


@given(st.lists(st.integers(0, 6), max_size=7, unique=True), st.lists(st.integers(0, 6), max_size=7, unique=True),
       st.lists(st.integers(0, 6), max_size=7))
def test_counting_a_prediction_and_uncounting_it_is_what_counting_block_by_block_gives(
    first: list[int], second: list[int], gone: list[int]
) -> None:
    """The C-speed count and uncount (blocks counted by two predictions, popped by an event in between) leave the
    counts that one-by-one arithmetic leaves. A prediction's blocks are distinct (chained hashes)."""
    counts: dict[int, int] = {}
    reference: dict[int, int] = {}
    for blocks in (first, second):
        _count(counts, blocks)
        for block in blocks:
            reference[block] = reference.get(block, 0) + 1
    for block in gone:  # an event names them: their predictions go
        counts.pop(block, None)
        reference.pop(block, None)
    _uncount(counts, first)
    for block in first:
        if block in reference:
            reference[block] -= 1
            if not reference[block]:
                del reference[block]
    assert counts == reference
