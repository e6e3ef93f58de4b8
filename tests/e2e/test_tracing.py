"""Agent tracing on the real mesh, exported over real OTLP to an in-test collector.

A two-turn tool loop with session and trajectory ids: each turn is one trace across all four
processes with correct parent/child links, every span carries the identity, turn 2 links to turn 1,
the dispatch event and the ``harness.tool`` span name the tool. With the collector down requests
still succeed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import SCRIPT, WEATHER_TOOL
from tests.support.mesh import RunningMesh, running_mesh
from tests.support.nats import free_port
from tests.support.otlp import Collector, ReceivedSpan

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

SERVICES = {"harnessmesh-gateway", "harnessmesh-parse", "harnessmesh-router", "harnessmesh-worker"}


async def _wait_for(collector: Collector, done: Any, what: str) -> list[ReceivedSpan]:
    for _ in range(150):
        spans = collector.snapshot()
        if done(spans):
            return spans
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def test_one_request_is_one_trace_across_every_process(
    mesh: RunningMesh, collector: tuple[str, Collector]
) -> None:
    body = {"model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": "trace me please"}]}
    headers = {"x-session-id": "sess-trace-1", "x-trajectory-id": "traj-1"}
    async with httpx.AsyncClient(base_url=mesh.http, timeout=30) as http:
        response = await http.post("/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200

    def complete(spans: list[ReceivedSpan]) -> bool:
        roots = [s for s in spans if s.attributes.get("session.id") == "sess-trace-1" and s.name == "gateway.request"]
        return bool(roots) and {s.service for s in spans if s.trace_id == roots[0].trace_id} >= SERVICES

    await _wait_for(collector[1], complete, "spans of all four services")


def _trace(spans: list[ReceivedSpan], trace_id: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.trace_id == trace_id]


async def test_two_turn_tool_loop_is_traced_per_turn(mesh: RunningMesh, collector: tuple[str, Collector]) -> None:
    session, trajectory = "sess-loop-7", "traj-loop-7"
    headers = {"x-session-id": session, "x-trajectory-id": trajectory, "user-agent": "my-agent/1.0"}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris?"}]
    async with httpx.AsyncClient(base_url=mesh.http, timeout=30) as http:
        first = await http.post("/v1/chat/completions", headers=headers,
                                json={"model": "demo", "messages": messages, "tools": [WEATHER_TOOL]})
        assert first.status_code == 200, first.text
        message = first.json()["choices"][0]["message"]
        (call,) = message["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        await asyncio.sleep(0.2)  # the harness "runs" the tool
        messages += [message, {"role": "tool", "tool_call_id": call["id"], "content": "22 degrees and sunny"}]
        second = await http.post("/v1/chat/completions", headers=headers,
                                 json={"model": "demo", "messages": messages, "tools": [WEATHER_TOOL]})
        assert second.status_code == 200, second.text
        assert "22 degrees" in second.json()["choices"][0]["message"]["content"]

    def roots_of(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
        return sorted((s for s in spans if s.name == "gateway.request" and s.attributes.get("session.id") == session),
                      key=lambda s: s.start_ns)

    def complete(spans: list[ReceivedSpan]) -> bool:
        roots = roots_of(spans)
        return len(roots) == 2 and all(
            {s.service for s in _trace(spans, r.trace_id)} >= SERVICES
            and any(s.name == "parse.stream" for s in _trace(spans, r.trace_id)) for r in roots) \
            and any(s.name == "harness.tool" for s in _trace(spans, roots[1].trace_id))

    spans = await _wait_for(collector[1], complete, "both turns' traces")
    await asyncio.sleep(0.5)  # stragglers of the same batch
    spans = collector[1].snapshot()
    turn1, turn2 = roots_of(spans)
    assert turn1.trace_id != turn2.trace_id  # one trace per turn

    for root in (turn1, turn2):
        tree = _trace(spans, root.trace_id)
        ids = {s.span_id for s in tree}
        assert [s for s in tree if not s.parent_span_id] == [root]
        assert all(s.parent_span_id in ids for s in tree if s is not root), "a span's parent is outside its trace"
        for span in tree:
            assert span.attributes.get("session.id") == session, (span.service, span.name)
            assert span.attributes.get("trajectory.id") == trajectory, (span.service, span.name)
            assert span.attributes.get("harness.name") == "my-agent", (span.service, span.name)
        by_id = {s.span_id: s for s in tree}
        chain = {s.name: s for s in tree}
        for name in ("parse.render", "parse.stream", "router.route", "worker.generate"):
            assert name in chain, (name, sorted(chain))
        # across processes: worker.generate <- worker server span <- router client span <- router.route
        route = chain["router.route"]
        ancestor = by_id[chain["worker.generate"].parent_span_id]
        while ancestor.span_id != route.span_id and ancestor.parent_span_id:
            ancestor = by_id[ancestor.parent_span_id]
        assert ancestor.span_id == route.span_id
        assert route.attributes["router.worker_id"] == chain["worker.generate"].attributes["worker.id"]
        assert route.attributes["router.mode"] == "kv" and route.attributes["router.reason"]
        assert len(route.attributes["router.candidate.workers"]) == 2
        assert "worker.cached_tokens" in chain["worker.generate"].attributes

    assert (turn1.trace_id, turn1.span_id) in turn2.links  # turn 2 links to turn 1
    stream1 = next(s for s in _trace(spans, turn1.trace_id) if s.name == "parse.stream")
    dispatch = [attrs for name, attrs in stream1.events if name == "tool_call.dispatch"]
    assert [(d["tool_call.id"], d["tool_call.name"]) for d in dispatch] == [(call["id"], "get_weather")]
    assert dispatch[0]["tool_call.since_first_token_ms"] >= 0
    (tool,) = [s for s in _trace(spans, turn2.trace_id) if s.name == "harness.tool"]
    assert tool.parent_span_id == turn2.span_id and (turn1.trace_id, turn1.span_id) in tool.links
    assert tool.attributes["gen_ai.tool.name"] == "get_weather" and tool.attributes["tool.call_id"] == call["id"]
    assert tool.attributes["tool.is_error"] is False
    assert tool.end_ns - tool.start_ns >= 150_000_000  # our dispatch -> the result's arrival spans the tool run
    assert turn2.attributes["gen_ai.usage.input_tokens"] > 0 and turn2.attributes["harnessmesh.worker_id"]


@pytest.fixture(scope="module")
def mesh_without_collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningMesh]:
    """A mesh exporting to a port nobody listens on."""
    tmp = tmp_path_factory.mktemp("nocollector")
    script = tmp / "script.jsonl"
    script.write_text("".join(__import__("json").dumps(line) + "\n" for line in SCRIPT))
    otel = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_EXPORTER_OTLP_TIMEOUT": "1"}
    args = ["--workers", "1", "--speedup", "20", "--script", str(script), "--reasoning-parser", "qwen3",
            "--tool-parser", "hermes", "--served-model-name", "demo"]
    with running_mesh(args, Path(tmp) / "mesh.log", env=otel) as running:
        yield running


async def test_requests_succeed_with_the_collector_down(mesh_without_collector: RunningMesh) -> None:
    body = {"model": "demo", "stream": True, "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [WEATHER_TOOL]}
    async with httpx.AsyncClient(base_url=mesh_without_collector.http, timeout=20) as http:
        for i in range(5):
            async with http.stream("POST", "/v1/chat/completions", json=body,
                                   headers={"x-session-id": f"down-{i}"}) as response:
                assert response.status_code == 200
                text = "".join([chunk async for chunk in response.aiter_text()])
            assert "get_weather" in text and text.rstrip().endswith("data: [DONE]")
