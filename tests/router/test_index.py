from __future__ import annotations

from services.common.block_hash import sequence_hashes
from services.router.index import ClearedEvent, KvIndex, RemovedEvent, StoredEvent


def stored(event_id: int, hashes: list[int]) -> StoredEvent:
    return StoredEvent(event_id, tuple(hashes))


def test_overlap_counts_leading_blocks_per_worker() -> None:
    prompt = list(range(100))
    hashes = sequence_hashes(prompt, 16)  # 6 full blocks
    index = KvIndex()
    index.apply("a", [stored(1, hashes[:4])])
    index.apply("b", [stored(1, hashes[:2])])
    assert index.overlaps(hashes, ["a", "b", "c"]) == {"a": 4, "b": 2, "c": 0}


def test_overlap_stops_at_first_missing_block() -> None:
    hashes = sequence_hashes(list(range(64)), 16)
    index = KvIndex()
    index.apply("a", [stored(1, [hashes[0], hashes[2], hashes[3]])])
    assert index.overlaps(hashes, ["a"]) == {"a": 1}


def test_overlap_past_a_gap_is_the_walk_not_the_guess() -> None:
    # every block but the 11th held: a binary search for the first missing block lands past the gap, and the
    # check of the blocks before its guess sends the answer back to the walk
    hashes = sequence_hashes(list(range(64 * 16)), 16)
    index = KvIndex(chains=False)
    index.apply("a", [stored(1, hashes[:10] + hashes[11:])])
    index.apply("b", [stored(1, hashes[:40])])
    assert index.overlaps(hashes, ["a", "b"]) == {"a": 10, "b": 40}


def test_different_prefix_does_not_match_even_with_same_tail() -> None:
    a = sequence_hashes([1] * 16 + [7] * 16, 16)
    b = sequence_hashes([2] * 16 + [7] * 16, 16)
    index = KvIndex()
    index.apply("w", [stored(1, a)])
    assert a[1] != b[1]  # chained: same block content, different parent
    assert index.overlaps(b, ["w"]) == {"w": 0}


def test_removed_and_cleared_events() -> None:
    hashes = sequence_hashes(list(range(48)), 16)
    index = KvIndex()
    index.apply("a", [stored(1, hashes), RemovedEvent(2, (hashes[2],))])
    assert index.overlaps(hashes, ["a"]) == {"a": 2}
    assert index.block_count("a") == 2
    index.apply("a", [ClearedEvent(3)])
    assert index.overlaps(hashes, ["a"]) == {"a": 0}
    assert index.block_count("a") == 0


def test_duplicates_are_ignored_and_gaps_counted() -> None:
    hashes = sequence_hashes(list(range(48)), 16)
    index = KvIndex()
    index.apply("a", [stored(1, hashes[:1]), stored(2, hashes[1:2])])
    index.apply("a", [RemovedEvent(2, (hashes[1],))])  # replay of an old id: ignored
    assert index.overlaps(hashes, ["a"]) == {"a": 2}
    assert index.gaps_seen == 0
    index.apply("a", [stored(5, hashes[2:3])])
    assert index.gaps_seen == 1


def test_remove_worker_drops_its_blocks_only() -> None:
    hashes = sequence_hashes(list(range(32)), 16)
    index = KvIndex()
    index.apply("a", [stored(1, hashes)])
    index.apply("b", [stored(1, hashes)])
    index.remove_worker("a")
    assert index.overlaps(hashes, ["a", "b"]) == {"a": 0, "b": 2}
    assert index.workers() == ["b"]
