"""The simulator runs the router's pending-prefix index as a live kv router does (issue 15: siblings)."""

from __future__ import annotations

from services.replay.simulator import Replay, ReplayConfig
from services.replay.trace import TraceRequest

SHARED = tuple(range(19))  # 19 trace blocks (9,728 tokens) every sibling starts with


def siblings() -> list[TraceRequest]:
    """Four requests sharing ~95 % of a 10k-token prompt, 1 ms apart: before any KV event can be out."""
    return [TraceRequest(float(i), 10_000, 50, (*SHARED, 1000 + i)) for i in range(4)]


def placements(ttl: float) -> set[str]:
    sim = Replay(ReplayConfig(workers=4, mode="kv", pending_prefix_ttl=ttl))
    sim.run(siblings())
    return {r.worker_id for r in sim.records}


def test_siblings_share_one_worker_with_the_pending_index() -> None:
    assert len(placements(3.0)) == 1


def test_siblings_spread_without_it() -> None:
    assert len(placements(0.0)) == 4
