"""The KV index's chain depths (``KvIndex(chains=True)``) against the walk (``chains=False``), hypothesis-driven.

Blocks form a random forest: a block's hash names its whole prefix, so each node has one fixed parent and
a prompt is a root-to-node path (then blocks nobody holds). Generated event streams store path segments
(with their first block's parent, which may or may not be held), remove any held blocks (a parent before
its children, a whole subtree, a middle block), clear, and sometimes bring an unchained event or a dump
(with the parents, as workers send it: chains rebuilt; without: the walk from then on). After every
event, every path, and every path continued by unknown blocks, gets the same overlap from both indexes.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.router.index import ClearedEvent, KvEvent, KvIndex, RemovedEvent, StoredEvent

NODES = 40


def forest(seed: int) -> list[int | None]:
    """Parent of each node (None: a root); node ids are the block hashes."""
    rng = random.Random(seed)
    return [None if i == 0 or rng.random() < 0.15 else rng.randrange(i) for i in range(NODES)]


def path(parents: list[int | None], node: int) -> list[int]:
    out = [node]
    while (up := parents[out[-1]]) is not None:
        out.append(up)
    return out[::-1]


Op = tuple[str, int, int]
ops = st.lists(st.tuples(st.sampled_from(["store", "store", "store", "remove", "remove", "clear", "unchained",
                                          "dump"]),
                         st.integers(0, NODES - 1), st.integers(1, 8)), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 10_000), script=ops)
def test_chain_depths_match_the_walk_after_every_event(seed: int, script: list[Op]) -> None:
    parents = forest(seed)
    rng = random.Random(seed)
    chained, walked = KvIndex(chains=True), KvIndex(chains=False)
    held: set[int] = set()
    event_id = 0
    for kind, node, size in script:
        event_id += 1
        event: KvEvent
        if kind in ("store", "unchained"):
            segment = path(parents, node)[-size:]
            parent = parents[segment[0]]
            event = StoredEvent(event_id, tuple(segment), parent=parent, chained=kind == "store")
            held.update(segment)
        elif kind == "remove":
            gone = tuple(rng.sample(sorted(held), min(size, len(held)))) if held else ()
            event = RemovedEvent(event_id, gone)
            held.difference_update(gone)
        elif kind == "clear":
            event = ClearedEvent(event_id)
            held.clear()
        else:  # a dump, with the parents (as a worker sends it) or, for the "dump" op's odd sizes, without
            blocks = sorted(held)
            links = [parents[b] for b in blocks] if size % 2 else None
            for index in (chained, walked):
                index.apply_dump("w", event_id, blocks, links)
            continue
        for index in (chained, walked):
            assert index.apply("w", [event]) is False
        for target in range(NODES):
            prompt = path(parents, target)
            for query in (prompt, [*prompt, 10_000 + target, 20_000 + target]):
                assert chained.overlaps(query, ["w"]) == walked.overlaps(query, ["w"]), (kind, node, query)


def test_a_removed_parent_hides_its_children_until_it_is_stored_again() -> None:
    index = KvIndex()
    index.apply("w", [StoredEvent(1, (1, 2, 3, 4), parent=None, chained=True)])
    assert index.overlaps([1, 2, 3, 4, 5], ["w"]) == {"w": 4}
    index.apply("w", [RemovedEvent(2, (2,))])
    assert index.overlaps([1, 2, 3, 4, 5], ["w"]) == {"w": 1}
    index.apply("w", [StoredEvent(3, (2,), parent=1, chained=True)])
    assert index.overlaps([1, 2, 3, 4, 5], ["w"]) == {"w": 4}


@pytest.mark.parametrize("breaker", ["unchained", "dump"])
def test_without_parents_the_index_walks_and_a_clear_brings_chains_back(breaker: str) -> None:
    index = KvIndex()
    index.apply("w", [StoredEvent(1, (1, 2), parent=None, chained=True)])
    if breaker == "dump":
        index.apply_dump("w", 2, [1, 2, 7])
    else:
        index.apply("w", [StoredEvent(2, (7,))])
    assert index.overlaps([1, 2, 7], ["w"]) == {"w": 3}  # the walk: 7 is held, whatever its parent
    index.apply("w", [ClearedEvent(3), StoredEvent(4, (1, 2), parent=None, chained=True)])
    assert index.overlaps([1, 2, 7], ["w"]) == {"w": 2}


def test_a_dump_with_parents_keeps_the_chains() -> None:
    index = KvIndex()
    index.apply_dump("w", 9, [4, 3, 2, 1], [3, 2, 1, None])  # any order
    assert index.overlaps([1, 2, 3, 4, 5], ["w"]) == {"w": 4}
    state = index._workers["w"]
    assert state.chains is not None and state.chains.depth == {1: 1, 2: 2, 3: 3, 4: 4}


def test_a_router_reads_the_stored_blocks_of_a_worker_that_predates_packed_arrays() -> None:
    from services.api import kv_pb2
    from services.router.convert import kv_events

    old = kv_pb2.KvEventBatch(worker_id="w", events=[kv_pb2.KvEvent(event_id=1, stored=kv_pb2.BlocksStored(
        blocks=[kv_pb2.StoredBlock(block_hash=h, engine_block_id=h, token_count=16) for h in (5, 6)]))])
    new = kv_pb2.KvEventBatch(worker_id="w", events=[kv_pb2.KvEvent(event_id=1, stored=kv_pb2.BlocksStored(
        block_hashes=[5, 6], engine_block_ids=[5, 6], token_counts=[16, 16]))])
    assert kv_events(old) == kv_events(new) == [StoredEvent(1, (5, 6), parent=None, chained=True)]
