"""Agent-aware retention through a worker's gRPC request: the issue-35 scenario on the mocker engine (a tool-call
turn, then finished turns that overflow the KV, then the tool result), with the worker's switch on and off."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from services.api import worker_pb2
from services.common import token_bytes
from services.worker.convert import request_from_proto
from services.worker.engine import EngineOutput, EngineRequest
from services.worker.mocker import MockerEngine

Make = Callable[..., Any]
PROMPT = 480  # tokens: 30 blocks of 16; the cache holds 64


def turn(rid: str, tokens: list[int], match_text: str = "", cache_ttl_s: float = 0.0) -> EngineRequest:
    """A turn as the parse service sends it for a conversation with tools: hold its KV for 60 s if it ends in
    a tool call (the scripted reply to "weather" is one; to "say hi", an answer)."""
    msg = worker_pb2.GenerateRequest(request_id=rid, token_ids_u32=token_bytes.pack(tokens), match_text=match_text,
                                     retention=worker_pb2.KvRetention(tool_call_hold_s=60.0))
    msg.hints.cache_ttl_s = cache_ttl_s
    msg.sampling.max_tokens = 64
    return request_from_proto(msg)


async def cached_tokens(engine: MockerEngine, req: EngineRequest) -> int:
    outs: list[EngineOutput] = [out async for out in engine.generate(req)]
    assert outs[-1].finish_reason is not None
    first = next(o.prompt for o in outs if o.prompt is not None)
    return first.cached_tokens


@pytest.mark.parametrize(("retention", "least", "most"), [(True, 0.9, 1.0), (False, 0.0, 0.05)])
async def test_the_tool_result_turn_finds_its_prompt_cached_only_with_retention(
        make_engine: Make, retention: bool, least: float, most: float) -> None:
    engine = await make_engine(block_size=16, num_blocks=64, retention=retention)
    session = list(range(1000, 1000 + PROMPT))
    await cached_tokens(engine, turn("tool-call", session, "weather in Paris?"))  # ends in a tool call
    for k in range(8):                                                     # unrelated turns that answered
        other = list(range(100_000 * (k + 1), 100_000 * (k + 1) + PROMPT))
        await cached_tokens(engine, turn(f"done-{k}", other, "say hi"))
    result = [*session, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]               # the call and its result appended
    cached = await cached_tokens(engine, turn("tool-result", result))
    assert least * PROMPT <= cached <= most * PROMPT


async def test_an_answered_turn_is_not_held_and_an_unused_lease_expires(make_engine: Make) -> None:
    engine = await make_engine(block_size=16, num_blocks=64)
    await cached_tokens(engine, turn("answer", list(range(1000, 1000 + PROMPT)), "say hi"))
    assert engine.core.blocks.retention.held_blocks == 0
    await cached_tokens(engine, turn("tool-call", list(range(5000, 5000 + PROMPT)), "weather in Paris?"))
    held = engine.core.blocks.retention.held_blocks
    assert held >= PROMPT // 16
    engine.core.blocks.retention.clock = lambda: float("inf")  # the tool result never came: the lease ran out
    for k in range(3):
        await cached_tokens(engine, turn(f"next-{k}", list(range(100_000 * (k + 1), 100_000 * (k + 1) + PROMPT))))
    stats = engine.core.blocks.retention.stats
    assert stats.expired_blocks > 0 and stats.broken_blocks == 0 and stats.hits == 0


def test_the_grpc_request_carries_the_hints_to_the_engine_core() -> None:
    msg = worker_pb2.GenerateRequest(request_id="r", token_ids_u32=token_bytes.pack([1, 2, 3]),
                                     retention=worker_pb2.KvRetention(tool_call_hold_s=60.0, evict_first=False))
    msg.hints.cache_ttl_s = 300.0
    req = request_from_proto(msg)
    assert (req.retention_hold_s, req.retention_first, req.retention_tool_call_hold_s) == (300.0, False, 60.0)
    plain = request_from_proto(worker_pb2.GenerateRequest(request_id="p", token_ids_u32=token_bytes.pack([1])))
    assert (plain.retention_hold_s, plain.retention_first, plain.retention_tool_call_hold_s) == (0.0, False, 0.0)


async def test_leases_and_hits_show_in_the_workers_metrics(make_engine: Make) -> None:
    from prometheus_client import generate_latest

    from services.worker.metrics import WorkerMetrics

    engine = await make_engine(block_size=16, num_blocks=64)
    metrics = WorkerMetrics()
    metrics.watch(engine, "w1")
    session = list(range(1000, 1000 + PROMPT))
    await cached_tokens(engine, turn("tool-call", session, "weather in Paris?"))
    text = generate_latest(metrics.registry).decode()
    held = engine.stats().extra["kv_retention_held_blocks"]
    assert held >= PROMPT // 16 and f'harnessmesh_worker_kv_leased_blocks{{worker="w1"}} {held}' in text, text[-1500:]
    await cached_tokens(engine, turn("tool-result", [*session, 7, 8]))
    text = generate_latest(metrics.registry).decode()
    assert 'harnessmesh_worker_kv_retention_lease_hits_total{worker="w1"} 1.0' in text
    assert f'harnessmesh_worker_kv_retention_hit_blocks_total{{worker="w1"}} {float(PROMPT // 16)}' in text
    assert engine.stats().extra["kv_retention_leases"] == 1.0
