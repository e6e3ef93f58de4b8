"""services.common.tracing and logging: sampler from env, identity from baggage on spans and log lines."""

from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry import context
from opentelemetry.sdk.trace import TracerProvider, sampling
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.common.logging import _add_trace_ids
from services.common.tracing import IdentitySpanProcessor, identity_context, sampler_from_env


def test_sampler_from_env() -> None:
    assert isinstance(sampler_from_env({}), sampling.ParentBased)
    assert sampler_from_env({"OTEL_TRACES_SAMPLER": "always_off"}) is sampling.ALWAYS_OFF
    ratio = sampler_from_env({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"})
    assert isinstance(ratio, sampling.TraceIdRatioBased) and ratio.rate == 0.25
    with pytest.raises(ValueError, match="OTEL_TRACES_SAMPLER"):
        sampler_from_env({"OTEL_TRACES_SAMPLER": "sometimes"})


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
