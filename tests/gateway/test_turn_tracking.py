"""The gateway's turn tracker: previous-turn links, execute_tool spans, metrics and trace records."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider, sampling
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway import turn_tracking
from gateway.app import create_app
from gateway.metrics import GatewayMetrics
from gateway.mooncake import to_mooncake
from gateway.parse_client import ParseClient
from gateway.settings import GatewaySettings
from gateway.trace_records import TraceRecordSink, read_records
from gateway.turn_tracking import TurnTracker
from services.api import chat_pb2, common_pb2
from services.common.grpc_util import open_channel
from tests.gateway.fake_parse import FakeParse, batch, call_start, dispatch, finish, started, text, usage

SECRET = "the secret prompt text"
HEADERS = {"x-session-id": "S", "x-trajectory-id": "T", "user-agent": "codex_exec/0.169.0"}


def _responder(request: chat_pb2.ChatRequest) -> list[chat_pb2.ChatEventBatch]:
    if request.messages[-1].role == "tool":
        return [batch(started(900, 512), text("done")), batch(finish(), usage(900, 5, 512))]
    return [batch(started(600, 0), call_start(0, "call_1", "bash")),
            batch(dispatch(0, "call_1", "bash", '{"cmd": "ls"}')),
            batch(finish(common_pb2.FINISH_REASON_TOOL_CALLS), usage(600, 12))]


async def _two_turns(http: httpx.AsyncClient) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": SECRET}]
    first = await http.post("/v1/chat/completions", json={"model": "demo", "messages": messages}, headers=HEADERS)
    assert first.status_code == 200
    message = first.json()["choices"][0]["message"]
    messages += [message, {"role": "tool", "tool_call_id": "call_1", "content": "file.txt"}]
    second = await http.post("/v1/chat/completions", json={"model": "demo", "messages": messages}, headers=HEADERS)
    assert second.status_code == 200


async def test_links_tool_spans_metrics_and_records(fake_parse: tuple[FakeParse, str], tmp_path: Path) -> None:
    fake_parse[0].responder = _responder
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    metrics = GatewayMetrics()
    sink = TraceRecordSink(tmp_path / "records.jsonl.gz")
    channel = open_channel(fake_parse[1], None)
    parse = ParseClient(channel, turns=TurnTracker(tracer, metrics, sink))
    app = create_app(parse, GatewaySettings(), tracer, metrics)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        await _two_turns(http)
        scrape = (await http.get("/metrics")).text
    await channel.close()
    sink.close()

    spans = exporter.get_finished_spans()
    roots = sorted((s for s in spans if s.name == "chat demo"), key=lambda s: s.start_time or 0)
    assert len(roots) == 2
    first_ctx = roots[0].get_span_context()
    assert first_ctx is not None
    assert [link.context for link in roots[1].links] == [first_ctx]
    (tool,) = [s for s in spans if s.name == "execute_tool bash"]
    assert tool.parent is not None and tool.parent.span_id == roots[1].get_span_context().span_id
    assert [link.context for link in tool.links] == [first_ctx] and tool.kind == trace.SpanKind.INTERNAL
    attrs = dict(tool.attributes or {})
    assert (attrs["gen_ai.operation.name"], attrs["gen_ai.tool.name"], attrs["gen_ai.tool.call.id"]) == \
        ("execute_tool", "bash", "call_1")
    assert (attrs["gen_ai.conversation.id"], attrs["gen_ai.agent.id"], attrs["gen_ai.agent.name"]) == \
        ("S", "T", "codex")
    assert (attrs["tool.call_id"], attrs["tool.is_error"]) == ("call_1", False) and "error.type" not in attrs
    root_attrs = dict(roots[1].attributes or {})
    assert (root_attrs["session.id"], root_attrs["trajectory.id"], root_attrs["harness.name"]) == ("S", "T", "codex")
    assert root_attrs["gen_ai.usage.cache_read.input_tokens"] == 512 and root_attrs["harnessmesh.api"] == "openai"
    assert (root_attrs["gen_ai.usage.input_tokens"], root_attrs["gen_ai.usage.output_tokens"]) == (900, 5)
    assert dict(roots[0].attributes or {})["gen_ai.response.finish_reasons"] == ("tool_calls",)

    samples = {s.name: s for f in text_string_to_metric_families(scrape) for s in f.samples}
    assert samples["harnessmesh_requests_total"].labels == {"model": "demo", "api": "openai", "outcome": "ok"}
    assert samples["harnessmesh_tool_dispatch_lead_seconds_count"].value == 1
    assert samples["harnessmesh_harness_tool_seconds_count"].value == 1
    assert samples["harnessmesh_cached_tokens_total"].value == 512

    with gzip.open(tmp_path / "records.jsonl.gz", "rt") as fh:
        raw = fh.read()
    assert SECRET not in raw and '"cmd"' not in raw  # never prompt text or arguments
    one, two = read_records(tmp_path / "records.jsonl.gz")
    assert (one["session_id"], one["trajectory_id"], one["finish_reason"]) == ("S", "T", "tool_calls")
    assert [(c["id"], c["name"]) for c in one["tool_calls"]] == [("call_1", "bash")]
    assert [(r["id"], r["name"], r["is_error"]) for r in two["tool_results"]] == [("call_1", "bash", False)]
    assert (two["prompt_tokens"], two["cached_tokens"], two["completion_tokens"]) == (900, 512, 5)
    assert one["trace_id"] == format(first_ctx.trace_id, "032x")
    assert json.loads(json.dumps(two))["v"] == 1


async def test_an_unsampled_turn_builds_no_span_attributes(
    fake_parse: tuple[FakeParse, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def not_for_unsampled(*args: object, **kwargs: object) -> dict[str, str]:
        raise AssertionError("span attributes built for a turn nothing samples")

    monkeypatch.setattr(turn_tracking, "conversation_attributes", not_for_unsampled)
    fake_parse[0].responder = _responder
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampling.ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    metrics = GatewayMetrics()
    channel = open_channel(fake_parse[1], None)
    parse = ParseClient(channel, turns=TurnTracker(tracer, metrics))
    identity = common_pb2.Identity(session_id="S", trajectory_id="T", harness="codex")
    messages = [chat_pb2.Message(role="user", parts=[chat_pb2.Part(text=SECRET)])]
    for turn in range(2):  # a dispatched call, then its result: the tool time is still measured
        with tracer.start_as_current_span("request"):
            request = chat_pb2.ChatRequest(request_id=f"r{turn}", model="demo", messages=messages, identity=identity)
            assert [b async for b in parse.chat(request)]
        messages.append(chat_pb2.Message(role="tool", tool_call_id="call_1",
                                         parts=[chat_pb2.Part(text="file.txt")]))
    await channel.close()
    assert exporter.get_finished_spans() == ()
    samples = {s.name: s for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
               for s in f.samples}
    assert samples["harnessmesh_harness_tool_seconds_count"].value == 1


def test_mooncake_reuses_a_trajectorys_previous_blocks() -> None:
    base = {"session_id": "S", "outcome": "ok", "completion_tokens": 100}
    records = [
        {**base, "ts": 10.0, "trajectory_id": "T", "prompt_tokens": 1100},
        {**base, "ts": 11.5, "trajectory_id": "T", "prompt_tokens": 1600},
        {**base, "ts": 12.0, "trajectory_id": "U", "prompt_tokens": 600},
        {**base, "ts": 12.5, "trajectory_id": "T", "prompt_tokens": 50, "outcome": "error"},
    ]
    a, b, c = to_mooncake(records)
    assert (a["timestamp"], b["timestamp"], c["timestamp"]) == (0.0, 1500.0, 2000.0)
    assert len(a["hash_ids"]) == 3 and b["hash_ids"][:2] == a["hash_ids"][:2]  # two full blocks shared
    assert len(b["hash_ids"]) == 4 and b["hash_ids"][2] not in a["hash_ids"]
    assert not set(c["hash_ids"]) & set(a["hash_ids"] + b["hash_ids"])
    assert b["input_length"] == 1600 and b["output_length"] == 100
