"""Real coding-agent traces (kv-cache-tester's Claude Code sessions) as replay traces: the converter
(``bench/agent_trace.py``) and the committed slice, which both simulators' trace readers take."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.agent_trace import GROUP, GroupIds, build_slice, cap_gaps, describe, flatten
from services.replay.sim_worker import SimWorkerConfig
from services.replay.simulator import ReplayConfig, replay
from services.replay.trace import TRACE_BLOCK, ideal_reuse, load_trace

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "kv_cache_tester_slice.jsonl"

pytestmark = pytest.mark.timeout(120)


def conversation() -> dict[str, object]:
    """A kv-cache-tester conversation: two parent turns around a sub-agent with two turns of its own."""
    return {
        "id": "trace_9999",
        "requests": [
            {"t": 0.0, "in": 1000, "out": 10, "hash_ids": list(range(1, 16)), "stop": "tool_use"},
            {"t": 50.0, "type": "subagent", "agent_id": "agent_001",
             "requests": [{"t": 0.0, "in": 640, "out": 5, "hash_ids": list(range(100, 110)), "stop": "tool_use"},
                          {"t": 4.0, "in": 700, "out": 5, "hash_ids": list(range(100, 111)), "stop": "end_turn"}]},
            {"t": 5000.0, "in": 1100, "out": 10, "hash_ids": list(range(1, 18)), "stop": "end_turn"},
        ],
    }


def test_flatten_puts_sub_agents_on_their_parents_clock() -> None:
    flat = flatten(conversation())
    assert [(r.t, r.session, r.stop) for r in flat] == [
        (0.0, "trace_9999", "tool_use"), (50.0, "trace_9999/agent_001", "tool_use"),
        (54.0, "trace_9999/agent_001", "end_turn"), (5000.0, "trace_9999", "end_turn")]
    assert flat[0].input_length == 960  # cut to the 15 ids' blocks: the ids cover the prompt


def test_idle_gaps_are_capped_and_order_kept() -> None:
    times = [t for t, _ in cap_gaps(flatten(conversation()), max_gap=60.0)]
    assert times == [0.0, 50.0, 54.0, 114.0]


def test_group_ids_name_prefixes_and_differ_across_conversations() -> None:
    ids = GroupIds()
    first = ids.convert("a", tuple(range(1, 16)))        # 8 + 7 ids
    longer = ids.convert("a", tuple(range(1, 18)))       # 8 + 8 + 1: the first group is the same block
    assert len(first) == 2 and len(longer) == 3
    assert longer[0] == first[0] and longer[1] != first[1]
    assert ids.convert("b", tuple(range(1, 16)))[0] != first[0]
    assert GROUP * 64 == TRACE_BLOCK


def test_a_slice_of_two_conversations(tmp_path: Path) -> None:
    for name in ("trace_0001", "trace_0002"):
        trace = conversation() | {"id": name}
        (tmp_path / f"{name}.json").write_text(json.dumps(trace))
    lines = build_slice(sorted(tmp_path.glob("*.json")), sessions=2, window=10.0, horizon=10_000.0,
                        max_gap=60.0, max_context=128_000, seed=1)
    assert len(lines) == 8
    assert [line["timestamp"] for line in lines] == sorted(line["timestamp"] for line in lines)
    info = describe(lines)
    assert info["sessions"] == 4 and info["subagent_requests"] == 4
    assert info["stops"] == {"tool_use": 4, "end_turn": 4}


def test_the_committed_slice_replays_with_the_pending_index_on_and_off() -> None:
    trace = load_trace(FIXTURE)
    raw = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    assert len(trace) == len(raw) == 124
    assert {r["stop"] for r in raw} == {"tool_use", "end_turn"}
    assert sum("/" in r["session"] for r in raw) == 98  # sub-agents' requests
    for r in raw:  # both readers require the ids to cover the prompt
        assert len(r["hash_ids"]) * TRACE_BLOCK >= r["input_length"]
    ideal = ideal_reuse(trace)
    worker = SimWorkerConfig(block_size=64, num_blocks=4096)
    for ttl in (3.0, 0.0):
        result = replay(trace, ReplayConfig(workers=2, worker=worker, pending_prefix_ttl=ttl))
        assert result.requests == 124 and result.failed == 0
        assert 0.5 * ideal < result.prefix_reuse <= ideal + 0.01
