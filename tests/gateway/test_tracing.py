"""The gateway's request span: a chat turn's is the GenAI ``chat {model}`` span with route, model, usage and
who-the-request-belongs-to (our names and ``gen_ai.*``); a caller's ``traceparent`` makes it a child of the
caller's span, and a caller's baggage never reaches the spans or the parse call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from opentelemetry import baggage
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.app import create_app
from gateway.parse_client import ParseClient
from gateway.settings import GatewaySettings
from gateway.trace_records import TraceRecordSink, read_records
from gateway.turn_tracking import TurnTracker
from services.api import chat_pb2
from services.common.grpc_util import open_channel, open_mux_channel
from services.common.tracing import IdentitySpanProcessor
from tests.gateway.fake_parse import FakeParse, batch, finish, started, text, usage

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


async def test_request_span(fake_parse: tuple[FakeParse, str]) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    channel = open_channel(fake_parse[1], None)
    tracer = provider.get_tracer("t")
    app = create_app(ParseClient(channel, turns=TurnTracker(tracer)), GatewaySettings(), tracer)
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"x-session-id": "s1", "x-trajectory-id": "t1", "user-agent": "OpenAI/Python 3.54.0"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        response = await http.post("/v1/chat/completions", json=body, headers=headers)
    await channel.close()
    assert response.status_code == 200
    (span,) = exporter.get_finished_spans()
    attrs = dict(span.attributes or {})
    assert span.name == "chat demo" and span.parent is None
    assert attrs["http.route"] == "/v1/chat/completions" and attrs["model"] == "demo"
    assert (attrs["session.id"], attrs["trajectory.id"], attrs["harness.name"]) == ("s1", "t1", "openai-python")
    assert attrs["http.response.status_code"] == 200
    assert {k: attrs[k] for k in GENAI} == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "harnessmesh", "gen_ai.request.model": "demo",
        "gen_ai.response.model": "demo", "gen_ai.conversation.id": "s1", "gen_ai.agent.id": "t1",
        "gen_ai.agent.name": "openai-python", "gen_ai.usage.input_tokens": 7, "gen_ai.usage.output_tokens": 1,
        "gen_ai.usage.cache_read.input_tokens": 0, "gen_ai.response.finish_reasons": ("stop",)}


GENAI = ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model", "gen_ai.response.model",
         "gen_ai.conversation.id", "gen_ai.agent.id", "gen_ai.agent.name", "gen_ai.usage.input_tokens",
         "gen_ai.usage.output_tokens", "gen_ai.usage.cache_read.input_tokens", "gen_ai.response.finish_reasons")


async def _one_turn(fake_parse: tuple[FakeParse, str], headers: dict[str, str], path: str = "/v1/chat/completions",
                    records: TraceRecordSink | None = None) -> tuple[ReadableSpan, dict[str, str]]:
    """One request through the app with an in-memory exporter: its span and the baggage parse received."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(IdentitySpanProcessor())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    received: dict[str, str] = {}

    def responder(request: chat_pb2.ChatRequest) -> list[chat_pb2.ChatEventBatch]:
        received.update({k: str(v) for k, v in baggage.get_all().items()})
        return [batch(started(9, 4), text("hi"), finish(), usage(9, 1, 4))]

    fake_parse[0].responder = responder
    channel, streams = open_channel(fake_parse[1], None), open_mux_channel(fake_parse[1])  # as the gateway's
    tracer = provider.get_tracer("t")
    turns = TurnTracker(tracer, records=records)
    app = create_app(ParseClient(channel, turns=turns, streams=streams), GatewaySettings(), tracer)
    body: dict[str, Any] = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
    if path == "/v1/messages":
        body["max_tokens"] = 16
    elif path == "/v1/responses":
        body = {"model": "demo", "input": "hi"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        response = await http.post(path, json=body, headers=headers)
    await channel.close()
    await streams.close()
    assert response.status_code == 200, response.text
    (span,) = exporter.get_finished_spans()
    return span, received


async def test_a_callers_traceparent_parents_the_turn_and_its_baggage_is_ignored(
    fake_parse: tuple[FakeParse, str], tmp_path: Path
) -> None:
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "tracestate": "openclaw=loop7",
               "baggage": "session.id=evil,harness.name=evil,x-extra=1",
               "x-session-id": "s1", "x-trajectory-id": "t1", "anthropic-version": "2023-06-01"}
    sink = TraceRecordSink(tmp_path / "records.jsonl")
    for path in ("/v1/chat/completions", "/v1/messages", "/v1/responses"):
        span, received = await _one_turn(fake_parse, headers, path, sink)
        assert span.name == "chat demo", path
        assert span.parent is not None and span.parent.is_remote
        assert (format(span.context.trace_id, "032x"), span.parent.span_id) == (TRACE_ID, int(PARENT_ID, 16))
        assert dict(span.context.trace_state) == {"openclaw": "loop7"}
        attrs = dict(span.attributes or {})
        assert (attrs["session.id"], attrs["gen_ai.conversation.id"]) == ("s1", "s1"), path
        assert attrs["gen_ai.usage.cache_read.input_tokens"] == 4
        assert "evil" not in str(attrs)
        assert received == {"session.id": "s1", "trajectory.id": "t1", "harness.name": "python-httpx"}, path
    sink.close()
    assert [r["trace_id"] for r in read_records(tmp_path / "records.jsonl")] == [TRACE_ID] * 3  # the harness's trace


async def test_a_malformed_traceparent_starts_a_trace_of_our_own(fake_parse: tuple[FakeParse, str]) -> None:
    span, _ = await _one_turn(fake_parse, {"traceparent": "00-not-a-trace-01", "x-session-id": "s1"})
    assert span.name == "chat demo" and span.parent is None


async def test_an_anonymous_turn_has_no_genai_conversation(fake_parse: tuple[FakeParse, str]) -> None:
    span, _ = await _one_turn(fake_parse, {})
    attrs = dict(span.attributes or {})
    assert str(attrs["session.id"]).startswith("sess-")
    assert "gen_ai.conversation.id" not in attrs and "gen_ai.agent.id" not in attrs
    assert attrs["gen_ai.operation.name"] == "chat"
