"""``bench/long_trace.py``: a deterministic, coding-agent-shaped Mooncake trace."""

from __future__ import annotations

import json
from pathlib import Path

from bench.long_trace import TRACE_BLOCK, generate
from services.replay import trace as replay_trace
from services.replay.trace import load_trace


def test_deterministic_and_in_mooncake_form(tmp_path: Path) -> None:
    kwargs = dict(sessions=4, turns=6, max_prompt=20_000, concurrency=2, system_tokens=3000, seed=3)
    lines = generate(**kwargs)  # type: ignore[arg-type]
    assert lines == generate(**kwargs)  # type: ignore[arg-type]
    assert lines != generate(**{**kwargs, "seed": 4})  # type: ignore[arg-type]
    assert TRACE_BLOCK == replay_trace.TRACE_BLOCK
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    trace = load_trace(path)
    assert len(trace) == 24
    assert [r.timestamp_ms for r in trace] == sorted(r.timestamp_ms for r in trace)
    for r in trace:
        assert len(r.hash_ids) == -(-r.input_length // TRACE_BLOCK)
        assert len(r.tokens()) == r.input_length


def test_an_id_names_its_prefix_and_sessions_grow_on_a_shared_system_prompt() -> None:
    lines = generate(sessions=6, turns=8, max_prompt=30_000, concurrency=3, system_tokens=4096, seed=0)
    parents: dict[int, tuple[int, ...]] = {}
    for line in lines:
        ids = list(line["hash_ids"])  # type: ignore[call-overload]
        assert ids[:8] == list(range(8))  # 4,096 system tokens: the same 8 blocks in every prompt
        for i, h in enumerate(ids):
            assert parents.setdefault(h, tuple(ids[:i])) == tuple(ids[:i])
    prompts = [int(line["input_length"]) for line in lines]  # type: ignore[call-overload]
    assert max(prompts) > 20_000
    assert max(prompts) <= 30_000 + 4 * 30_000 // 7 + 1000 + 4000  # at most one turn's growth past the cap
