"""Agent tracing on the real mesh, exported over real OTLP to an in-test collector.

A two-turn tool loop with session and trajectory ids: each turn is one trace across all four
processes with correct parent/child links, its root is the GenAI ``chat {model}`` span with the GenAI
identity and usage attributes, every span carries the identity, turn 2 links to turn 1, the dispatch
event and the ``execute_tool {tool}`` span name the tool. A harness's W3C ``traceparent`` on each API (the
three HTTP APIs and the gRPC edge) makes the turn a child of the harness's span in the harness's trace,
and the baggage it sends reaches no span. With the collector down requests still succeed.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from services.api import chat_pb2, chat_pb2_grpc, common_pb2
from tests.e2e.conftest import SCRIPT, WEATHER_TOOL
from tests.support.mesh import RunningMesh, running_mesh
from tests.support.nats import free_port
from tests.support.otlp import Collector, ReceivedSpan

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

SERVICES = {"harnessmesh-gateway", "harnessmesh-parse", "harnessmesh-router", "harnessmesh-worker"}
CHAT = "chat demo"  # the GenAI conventions' inference span name: "{gen_ai.operation.name} {gen_ai.request.model}"


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
        roots = [s for s in spans if s.attributes.get("session.id") == "sess-trace-1" and s.name == CHAT]
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
        return sorted((s for s in spans if s.name == CHAT and s.attributes.get("session.id") == session),
                      key=lambda s: s.start_ns)

    def complete(spans: list[ReceivedSpan]) -> bool:
        roots = roots_of(spans)
        return len(roots) == 2 and all(
            {s.service for s in _trace(spans, r.trace_id)} >= SERVICES
            and any(s.name == "parse.stream" for s in _trace(spans, r.trace_id)) for r in roots) \
            and any(s.name == "execute_tool get_weather" for s in _trace(spans, roots[1].trace_id))

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
        genai = root.attributes
        assert (genai["gen_ai.operation.name"], genai["gen_ai.provider.name"]) == ("chat", "harnessmesh")
        assert (genai["gen_ai.request.model"], genai["gen_ai.response.model"]) == ("demo", "demo")
        assert (genai["gen_ai.conversation.id"], genai["gen_ai.agent.id"], genai["gen_ai.agent.name"]) == \
            (session, trajectory, "my-agent")
        assert genai["gen_ai.usage.input_tokens"] > 0 and genai["gen_ai.usage.output_tokens"] > 0
        assert 0 <= genai["gen_ai.usage.cache_read.input_tokens"] <= genai["gen_ai.usage.input_tokens"]
        assert genai["gen_ai.usage.reasoning.output_tokens"] > 0  # both scripted turns think first
        assert genai["gen_ai.response.time_to_first_chunk"] > 0
        for name in ("parse.render", "parse.stream"):
            assert chain[name].attributes["gen_ai.conversation.id"] == session, name
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
    assert turn1.attributes["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert turn2.attributes["gen_ai.usage.cache_read.input_tokens"] > 0  # turn 1's prompt, kept on its worker
    (tool,) = [s for s in _trace(spans, turn2.trace_id) if s.name == "execute_tool get_weather"]
    assert tool.parent_span_id == turn2.span_id and (turn1.trace_id, turn1.span_id) in tool.links
    assert (tool.attributes["gen_ai.operation.name"], tool.attributes["gen_ai.tool.name"]) == \
        ("execute_tool", "get_weather")
    assert tool.attributes["gen_ai.tool.call.id"] == tool.attributes["tool.call_id"] == call["id"]
    assert tool.attributes["gen_ai.conversation.id"] == session and tool.attributes["tool.is_error"] is False
    assert tool.end_ns - tool.start_ns >= 150_000_000  # our dispatch -> the result's arrival spans the tool run
    assert turn2.attributes["gen_ai.usage.input_tokens"] > 0 and turn2.attributes["harnessmesh.worker_id"]


# What a harness that traces its own loop sends (OpenClaw: one trace id across the loop), plus baggage that
# claims another identity: only the trace context may be taken from it.
HOSTILE_BAGGAGE = "session.id=evil-session,trajectory.id=evil-trajectory,harness.name=evil-harness,x-extra=evil"


async def _http_turn(http: httpx.AsyncClient, api: str, headers: dict[str, str]) -> None:
    messages = [{"role": "user", "content": f"joined turn via {api}"}]
    if api == "openai":
        path, body = "/v1/chat/completions", {"model": "demo", "max_tokens": 4, "messages": messages}
    elif api == "anthropic":
        path, body = "/v1/messages", {"model": "demo", "max_tokens": 4, "messages": messages}
        headers = {**headers, "anthropic-version": "2023-06-01"}
    else:
        path, body = "/v1/responses", {"model": "demo", "max_output_tokens": 4, "input": f"joined turn via {api}"}
    response = await http.post(path, json=body, headers=headers)
    assert response.status_code == 200, (api, response.text)


async def _grpc_turn(target: str, headers: dict[str, str]) -> None:
    request = chat_pb2.ChatRequest(model="demo", sampling=common_pb2.SamplingParams(max_tokens=4), messages=[
        chat_pb2.Message(role="user", parts=[chat_pb2.Part(text="joined turn via grpc")])])
    async with grpc.aio.insecure_channel(target) as channel:
        batches = [b async for b in chat_pb2_grpc.AgentServiceStub(channel).Chat(request,
                                                                                metadata=tuple(headers.items()))]
    assert any(e.HasField("finish") for b in batches for e in b.events)


def _subtree(spans: list[ReceivedSpan], root: ReceivedSpan) -> list[ReceivedSpan]:
    by_id = {s.span_id: s for s in spans}
    out = []
    for span in spans:
        node: ReceivedSpan | None = span
        while node is not None and node.span_id != root.span_id:
            node = by_id.get(node.parent_span_id)
        if node is not None:
            out.append(span)
    return out


async def test_a_harness_traceparent_makes_every_api_join_the_harness_trace(
    mesh: RunningMesh, collector: tuple[str, Collector]
) -> None:
    trace_id, session = os.urandom(16).hex(), "sess-joined-3"
    parents = {api: os.urandom(8).hex() for api in ("openai", "anthropic", "responses", "grpc")}

    def headers(api: str) -> dict[str, str]:
        return {"traceparent": f"00-{trace_id}-{parents[api]}-01", "tracestate": "openclaw=loop",
                "baggage": HOSTILE_BAGGAGE, "x-session-id": session, "x-trajectory-id": f"traj-{api}"}

    async with httpx.AsyncClient(base_url=mesh.http, timeout=30) as http:
        for api in ("openai", "anthropic", "responses"):
            await _http_turn(http, api, headers(api))
    await _grpc_turn(mesh.grpc, headers("grpc"))

    def roots(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
        return {s.attributes.get("harnessmesh.api", ""): s for s in spans
                if s.trace_id == trace_id and s.name == CHAT and s.service == "harnessmesh-gateway"}

    def complete(spans: list[ReceivedSpan]) -> bool:
        found = roots(spans)
        joined = _trace(spans, trace_id)
        return set(found) == set(parents) and all(
            {s.service for s in _subtree(joined, root)} >= SERVICES for root in found.values())

    await _wait_for(collector[1], complete, "four joined turns across every process")
    await asyncio.sleep(0.5)  # stragglers of the same batch
    spans = _trace(collector[1].snapshot(), trace_id)
    for api, root in roots(spans).items():
        assert root.parent_span_id == parents[api], api  # a child of the harness's span, in the harness's trace
        assert (root.attributes["gen_ai.conversation.id"], root.attributes["gen_ai.agent.id"]) == \
            (session, f"traj-{api}"), api
        assert root.attributes["gen_ai.usage.output_tokens"] > 0, api
        for span in _subtree(spans, root):
            assert span.attributes.get("session.id") == session, (api, span.service, span.name)
            assert span.attributes.get("trajectory.id") == f"traj-{api}", (api, span.service, span.name)
    assert not [s for s in spans if "evil" in repr(s.attributes)]  # the baggage reached no span anywhere
    assert {s.parent_span_id for s in spans if s.parent_span_id not in {x.span_id for x in spans}} == \
        set(parents.values())  # nothing else hangs off the harness's trace


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
