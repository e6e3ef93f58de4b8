"""Placement on agent traffic: prefill counted as a shortest-first worker serves it, the KV term over capacity,
and session footprints (``policy.py``, ``footprint.py``)."""

from __future__ import annotations

import random

import pytest

from services.api import common_pb2, worker_pb2
from services.common.block_hash import sequence_hashes
from services.router.convert import endpoint, proxy_request, session_key, worker_info
from services.router.footprint import SessionFootprints
from services.router.index import KvIndex, StoredEvent
from services.router.policy import PlacementPolicy
from services.router.registry import WorkerEndpoint, WorkerLoad, WorkerRegistry
from services.router.router import Router

BS = 16


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_router(*, shortest: bool = True, capacity: int = 4096, footprints: SessionFootprints | None = None,
                workers: int = 2) -> Router:
    registry = WorkerRegistry(timeout=5.0)
    for i in range(workers):
        registry.heartbeat(WorkerEndpoint(f"w{i}", f"127.0.0.1:{1000 + i}", BS, capacity,
                                          shortest_prefill_first=shortest))
    return Router(KvIndex(), registry, PlacementPolicy("kv", 8.0, random.Random(0)), footprints=footprints)


def prompt(session: int, blocks: int) -> list[int]:
    return [session * 1_000_000 + i for i in range(blocks * BS)]


def cache(router: Router, worker: str, tokens: list[int]) -> None:
    router.on_kv_events(worker, [StoredEvent(1, tuple(sequence_hashes(tokens, BS)))])


def start(router: Router, worker: str, tokens: list[int], session: str = "") -> None:
    placement = router.place(tokens, session=session)
    best = next(c for c in placement.candidates if c.worker_id == worker)
    router.begin(worker, placement, best)


def test_prefill_ahead_counts_each_request_up_to_the_new_prompts_size() -> None:
    load = WorkerLoad()
    for size in (10, 500, 500):
        load.add_prefill(size)
    assert load.prefill_blocks == 1010
    assert load.prefill_ahead(50) == 10 + 50 + 50
    assert load.prefill_ahead(5) == 15
    load.end_prefill(500)
    assert load.prefill_ahead(50) == 60 and load.prefills == {10: 1, 500: 1}
    load.end_prefill(0)   # a request with nothing to prefill leaves no trace
    assert load.prefills == {10: 1, 500: 1}


@pytest.mark.parametrize(("shortest", "expected"), [(True, "w0"), (False, "w1")])
def test_a_next_turn_stays_with_its_cache_behind_another_sessions_cold_prompt_only_if_served_shortest_first(
        shortest: bool, expected: str) -> None:
    router = make_router(shortest=shortest)
    turn = prompt(1, 200) + prompt(9, 4)   # 200 cached blocks on w0, 4 new
    cache(router, "w0", prompt(1, 200))
    start(router, "w0", prompt(2, 400))     # another session's cold 400-block prompt prefilling on w0
    assert router.place(turn).candidates[0].worker_id == expected


def test_two_long_sessions_decoding_do_not_push_a_turn_off_its_cache() -> None:
    router = make_router(capacity=16384)
    turn = prompt(1, 300) + prompt(9, 20)
    cache(router, "w0", prompt(1, 300))
    for s in (2, 3):   # two 1,200-block sessions decoding on w0 (their prefill done)
        placement = router.place(prompt(s, 1200))
        best = next(c for c in placement.candidates if c.worker_id == "w0")
        router.begin("w0", placement, best).prefill_done()
    best = router.place(turn).candidates[0]
    assert (best.worker_id, best.new_blocks) == ("w0", 20)
    # Linear, as without a capacity: 2,400 blocks held outweigh 8 x 300 blocks of prefill saved.
    linear = Router(router.index, router.registry, PlacementPolicy("kv", 8.0))
    assert linear.policy.rank(320, {"w0": 300, "w1": 0}, {w: router.registry.load(w) for w in ("w0", "w1")}
                              )[0].worker_id == "w1"


def test_a_nearly_full_worker_weighs_its_whole_capacity() -> None:
    router = make_router(capacity=1000)
    cache(router, "w0", prompt(1, 100))
    placement = router.place(prompt(2, 900))
    router.begin("w0", placement, next(c for c in placement.candidates if c.worker_id == "w0")).prefill_done()
    turn = prompt(1, 100) + prompt(9, 10)   # w0 would hold 1,010 of 1,000 blocks: the turn goes to the idle one
    assert router.place(turn).candidates[0].worker_id == "w1"


def test_footprints_sum_each_sessions_last_prompt_on_its_worker_within_the_window() -> None:
    clock = Clock()
    f = SessionFootprints(600.0, clock)
    f.record("a", "w0", 100)
    f.record("b", "w0", 50)
    f.record("c", "w1", 70)
    assert f.live() == {"w0": 150, "w1": 70}
    assert f.live("a") == {"w0": 50, "w1": 70}     # a session's own footprint is left out
    clock.now = 300.0
    f.record("a", "w1", 120)                       # a's next turn moved: its footprint moves with it
    assert f.live() == {"w0": 50, "w1": 190}
    clock.now = 650.0                              # b and c: last seen 650 s ago
    assert f.live() == {"w1": 120} and len(f) == 1
    f.remove_worker("w1")
    assert f.live() == {} and len(f) == 0
    f.record("", "w0", 10)                         # no session: nothing to remember
    assert len(f) == 0
    with pytest.raises(ValueError, match="window"):
        SessionFootprints(0.0)


def test_a_new_session_goes_where_live_sessions_leave_the_most_room() -> None:
    clock = Clock()
    router = make_router(footprints=SessionFootprints(600.0, clock), workers=3)
    for s, worker in ((1, "w0"), (2, "w0"), (3, "w1")):
        start(router, worker, prompt(s, 300), session=f"s{s}")
    for wid in ("w0", "w1"):   # their requests finished: nothing is in flight anywhere
        load = router.registry.load(wid)
        load.requests = load.active_blocks = 0
    load = router.registry.load("w2")
    load.active_blocks = 200   # a short request in flight on w2, no live session there
    assert router.place(prompt(4, 300), session="s4").candidates[0].worker_id == "w2"
    # Without footprints the in-flight load decides: w0 and w1 look idle.
    plain = make_router(workers=3)
    plain.registry.load("w2").active_blocks = 200
    assert plain.place(prompt(4, 300)).candidates[0].worker_id == "w0"
    # A session's own footprint does not push it off the worker holding its prefix.
    cache(router, "w0", prompt(1, 300))
    assert router.place(prompt(1, 300) + prompt(9, 5), session="s1").candidates[0].worker_id == "w0"


def test_the_router_reads_the_session_and_the_prefill_order_off_the_wire() -> None:
    request = worker_pb2.GenerateRequest(identity=common_pb2.Identity(session_id="S", trajectory_id="agent-1"))
    assert proxy_request(request, b"").session == "S/agent-1"
    assert session_key(common_pb2.Identity(session_id="S")) == "S"
    assert session_key(common_pb2.Identity(session_id="S", anonymous=True)) == ""
    ep = WorkerEndpoint("w", "h:1", 16, 100, shortest_prefill_first=True)
    assert endpoint(worker_info(ep)) == ep
