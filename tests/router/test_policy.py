from __future__ import annotations

import random

import pytest

from services.common.block_hash import sequence_hashes
from services.router.index import KvIndex, StoredEvent
from services.router.policy import PlacementPolicy
from services.router.registry import WorkerEndpoint, WorkerLoad, WorkerRegistry
from services.router.router import InFlight, Router


def make_router(mode: str = "kv", workers: tuple[str, ...] = ("w1", "w2")) -> Router:
    registry = WorkerRegistry(timeout=5.0)
    for wid in workers:
        registry.heartbeat(WorkerEndpoint(wid, f"127.0.0.1:{hash(wid) % 1000 + 1000}", 16, 1000))
    return Router(KvIndex(), registry, PlacementPolicy(mode, 1.0, random.Random(0)))


def test_kv_mode_prefers_the_worker_holding_the_prefix() -> None:
    router = make_router()
    prompt = list(range(160))
    router.on_kv_events("w2", [StoredEvent(1, tuple(sequence_hashes(prompt, 16)[:8]))])
    placement = router.place(prompt)
    assert placement.request_blocks == 10
    best = placement.candidates[0]
    assert (best.worker_id, best.overlap_blocks, best.new_blocks) == ("w2", 8, 2)


def test_kv_mode_weighs_load_against_overlap() -> None:
    router = make_router()
    prompt = list(range(160))
    router.on_kv_events("w2", [StoredEvent(1, tuple(sequence_hashes(prompt, 16)[:2]))])
    # w2 saves 2 blocks of prefill but already has 50 blocks of KV in use: w1 is cheaper.
    held = InFlight(router.registry.load("w2"), blocks=50, prefill_blocks=0)
    assert router.place(prompt).candidates[0].worker_id == "w1"
    held.release()
    assert router.place(prompt).candidates[0].worker_id == "w2"


def test_ties_go_to_fewer_requests_in_flight() -> None:
    router = make_router()
    held = InFlight(router.registry.load("w1"), blocks=0, prefill_blocks=0)
    assert router.place(list(range(32))).candidates[0].worker_id == "w2"
    held.release()


def test_round_robin_rotates() -> None:
    router = make_router("round-robin", ("a", "b", "c"))
    firsts = [router.place([1] * 16).candidates[0].worker_id for _ in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]


def test_least_loaded() -> None:
    router = make_router("least-loaded", ("a", "b"))
    held = InFlight(router.registry.load("a"), 1, 1)
    assert router.place([1] * 16).candidates[0].worker_id == "b"
    held.release()


def test_exclusion_and_empty() -> None:
    router = make_router()
    assert [c.worker_id for c in router.place([1] * 16, exclude=frozenset({"w1"})).candidates] == ["w2"]
    assert router.place([1] * 16, exclude=frozenset({"w1", "w2"})).candidates == []


def test_unknown_mode_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown routing mode"):
        PlacementPolicy("nope", 1.0).rank(1, {"a": 0}, {"a": WorkerLoad()})


def test_registry_expires_silent_workers() -> None:
    now = [0.0]
    registry = WorkerRegistry(timeout=2.0, clock=lambda: now[0])
    ep = WorkerEndpoint("w", "127.0.0.1:1", 16, 10)
    assert registry.heartbeat(ep) is True
    assert registry.heartbeat(ep) is False
    now[0] = 1.5
    assert registry.expire() == []
    now[0] = 3.0
    assert registry.expire() == [ep]
    assert len(registry) == 0
