"""services.common.tracing and logging: sampler from env, identity from baggage on spans and log lines, the
GenAI identity attributes, a caller's W3C trace context joined at the edges and its baggage left out."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from opentelemetry import baggage, context, trace
from opentelemetry.sdk.trace import TracerProvider, sampling
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.api import chat_pb2
from services.common.logging import _add_trace_ids
from services.common.tracing import (
    EDGE_SERVICE,
    IdentitySpanProcessor,
    conversation_attributes,
    identity_context,
    incoming_parent,
    sampler_for,
    sampler_from_env,
    server_interceptors,
)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


def test_sampler_from_env() -> None:
    assert isinstance(sampler_from_env({}), sampling.ParentBased)
    assert sampler_from_env({"OTEL_TRACES_SAMPLER": "always_off"}) is sampling.ALWAYS_OFF
    ratio = sampler_from_env({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"})
    assert isinstance(ratio, sampling.TraceIdRatioBased) and ratio.rate == 0.25
    with pytest.raises(ValueError, match="OTEL_TRACES_SAMPLER"):
        sampler_from_env({"OTEL_TRACES_SAMPLER": "sometimes"})


def test_a_process_that_exports_nothing_records_no_span_unless_a_sampler_is_asked_for() -> None:
    assert sampler_for({}, exporting=False) is sampling.ALWAYS_OFF
    assert isinstance(sampler_for({}, exporting=True), sampling.ParentBased)
    asked = sampler_for({"OTEL_TRACES_SAMPLER": "always_on"}, exporting=False)
    assert asked is sampling.ALWAYS_ON
    provider = TracerProvider(sampler=sampler_for({}, exporting=False))
    with provider.get_tracer("t").start_as_current_span("s") as span:
        assert not span.is_recording()
        assert span.get_span_context().is_valid  # the trace context still propagates


def test_identity_reaches_every_span_and_log_line() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(IdentitySpanProcessor())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    token = context.attach(identity_context("S", "T", "codex"))
    try:
        with tracer.start_as_current_span("outer"), tracer.start_as_current_span("inner"):
            line: dict[str, Any] = dict(_add_trace_ids(None, "info", {"event": "x"}))
    finally:
        context.detach(token)
    with tracer.start_as_current_span("root") as root:  # no baggage: a child inherits its local parent's attributes
        root.set_attributes({"session.id": "S2", "trajectory.id": "T2"})
        with tracer.start_as_current_span("child"):
            from_span = dict(_add_trace_ids(None, "info", {"event": "y"}))
    spans = {s.name: dict(s.attributes or {}) for s in exporter.get_finished_spans()}
    for name in ("outer", "inner"):
        assert (spans[name]["session.id"], spans[name]["trajectory.id"], spans[name]["harness.name"]) == \
            ("S", "T", "codex")
    assert (spans["child"]["session.id"], spans["child"]["trajectory.id"]) == ("S2", "T2")
    assert (line["session_id"], line["trajectory_id"], line["harness"]) == ("S", "T", "codex")
    assert len(line["trace_id"]) == 32 and len(line["span_id"]) == 16
    assert from_span["session_id"] == "S2" and json.dumps(from_span)


def test_conversation_attributes_use_our_names_and_the_genai_names() -> None:
    assert conversation_attributes("S", "T", "codex") == {
        "session.id": "S", "trajectory.id": "T", "harness.name": "codex",
        "gen_ai.conversation.id": "S", "gen_ai.agent.id": "T", "gen_ai.agent.name": "codex"}
    # a session the gateway made up for one request is no conversation id (the conventions forbid inventing one)
    made_up = conversation_attributes("sess-1f", "sess-1f", "", anonymous=True)
    assert made_up == {"session.id": "sess-1f", "trajectory.id": "sess-1f", "harness.name": ""}


def test_incoming_parent_takes_the_trace_context_and_never_the_baggage() -> None:
    token = context.attach(baggage.set_baggage("session.id", "ours"))
    try:
        ctx = incoming_parent({"traceparent": TRACEPARENT, "tracestate": ["vendor=a", "other=b"],
                               "baggage": "session.id=evil"})
    finally:
        context.detach(token)
    assert ctx is not None
    parent = trace.get_current_span(ctx).get_span_context()
    assert (format(parent.trace_id, "032x"), format(parent.span_id, "016x")) == (TRACE_ID, PARENT_ID)
    assert parent.is_remote and parent.trace_flags.sampled
    assert dict(parent.trace_state) == {"vendor": "a", "other": "b"}
    assert baggage.get_all(ctx) == {}  # neither the caller's nor the current context's
    assert incoming_parent({}) is None
    assert incoming_parent({"tracestate": "vendor=a"}) is None
    for bad in ("00-zz-00f067aa0ba902b7-01", f"00-{'0' * 32}-{PARENT_ID}-01", f"00-{TRACE_ID}-{'0' * 16}-01"):
        assert incoming_parent({"traceparent": bad}) is None, bad


def _recorder(seen: dict[str, Any], key: str) -> Any:
    async def chat(request: chat_pb2.ChatRequest, servicer_context: Any) -> Any:
        span = trace.get_current_span()
        seen[key] = (dict(baggage.get_all()), span.get_span_context(), getattr(span, "parent", None),
                     [md[0] for md in servicer_context.invocation_metadata()])
        yield chat_pb2.ChatEventBatch()
    return grpc.unary_stream_rpc_method_handler(chat, request_deserializer=chat_pb2.ChatRequest.FromString,
                                                response_serializer=chat_pb2.ChatEventBatch.SerializeToString)


async def test_the_public_grpc_service_joins_the_callers_trace_without_its_baggage() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(IdentitySpanProcessor())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    seen: dict[str, Any] = {}
    server = grpc.aio.server(interceptors=server_interceptors(provider))
    server.add_generic_rpc_handlers((
        grpc.method_handlers_generic_handler(EDGE_SERVICE, {"Chat": _recorder(seen, "edge")}),
        grpc.method_handlers_generic_handler("harnessmesh.v1.Inner", {"Chat": _recorder(seen, "inner")}),
    ))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    metadata = (("traceparent", TRACEPARENT), ("tracestate", "vendor=a"),
                ("baggage", "session.id=evil,harness.name=evil"), ("x-session-id", "S"))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            for method in (f"/{EDGE_SERVICE}/Chat", "/harnessmesh.v1.Inner/Chat"):
                call = channel.unary_stream(method, request_serializer=chat_pb2.ChatRequest.SerializeToString,
                                            response_deserializer=chat_pb2.ChatEventBatch.FromString)
                assert len([b async for b in call(chat_pb2.ChatRequest(), metadata=metadata)]) == 1
    finally:
        await server.stop(0)
    edge_baggage, edge_span, edge_parent, edge_keys = seen["edge"]
    assert edge_baggage == {} and "baggage" not in edge_keys and "x-session-id" in edge_keys
    assert format(edge_span.trace_id, "032x") == TRACE_ID and edge_parent.span_id == int(PARENT_ID, 16)
    assert dict(edge_span.trace_state) == {"vendor": "a"}
    assert seen["inner"][0] == {"session.id": "evil", "harness.name": "evil"}  # mesh peers' baggage is taken
    edge = next(s for s in exporter.get_finished_spans() if s.name == f"/{EDGE_SERVICE}/Chat")
    assert "session.id" not in (edge.attributes or {}) and "harness.name" not in (edge.attributes or {})
