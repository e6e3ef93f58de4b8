"""OpenTelemetry set up once per process, configured by the standard ``OTEL_*`` env vars.

Exporter choice: ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console`` or ``none``). When it is unset,
spans are exported over OTLP only if ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the traces-specific
endpoint) is set, so a laptop without a collector stays quiet. ``OTEL_EXPORTER_OTLP_PROTOCOL``
picks ``grpc`` (default) or ``http/protobuf``. Sampling: ``OTEL_TRACES_SAMPLER`` (default
``parentbased_always_on``) and ``OTEL_TRACES_SAMPLER_ARG``. Spans go through a batch processor, so a
collector that is down never blocks a request (spans are dropped when its queue is full).

Identity: who a request belongs to travels as W3C baggage (``session.id``, ``trajectory.id``,
``harness.name``) next to the trace context in every gRPC hop's metadata (the grpc instrumentation
injects and extracts both through the global propagator). :class:`IdentitySpanProcessor` copies those
entries onto every span a process starts, so each span is searchable by session in Jaeger, and the
log processor in ``services.common.logging`` puts them on every log line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import baggage, context, trace
from opentelemetry.instrumentation.grpc import aio_client_interceptors, aio_server_interceptor, filters
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from services.common.mux import SERVICE_NAME as MUX_SERVICE

# Baggage keys == span attribute names (Jaeger tag search: session.id=...).
SESSION = "session.id"
TRAJECTORY = "trajectory.id"
HARNESS = "harness.name"
IDENTITY_KEYS = (SESSION, TRAJECTORY, HARNESS)


def _exporter(environ: Mapping[str, str]) -> SpanExporter | None:
    kind = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not kind:
        has_endpoint = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
        )
        kind = "otlp" if has_endpoint else "none"
    if kind == "none":
        return None
    if kind == "console":
        return ConsoleSpanExporter()
    if kind != "otlp":
        raise ValueError(f"OTEL_TRACES_EXPORTER={kind!r}: expected otlp, console or none")
    protocol = environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    )
    if protocol.startswith("http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        return HttpExporter()
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

    return GrpcExporter()


_SAMPLERS = {
    "always_on": lambda arg: sampling.ALWAYS_ON,
    "always_off": lambda arg: sampling.ALWAYS_OFF,
    "traceidratio": lambda arg: sampling.TraceIdRatioBased(arg),
    "parentbased_always_on": lambda arg: sampling.ParentBased(sampling.ALWAYS_ON),
    "parentbased_always_off": lambda arg: sampling.ParentBased(sampling.ALWAYS_OFF),
    "parentbased_traceidratio": lambda arg: sampling.ParentBased(sampling.TraceIdRatioBased(arg)),
}


def sampler_from_env(environ: Mapping[str, str]) -> sampling.Sampler:
    """The sampler named by ``OTEL_TRACES_SAMPLER`` (ratio in ``OTEL_TRACES_SAMPLER_ARG``, default 1.0).

    Parent-based samplers keep whole traces: the gateway decides, every other hop follows.
    """
    name = environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower() or "parentbased_always_on"
    if name not in _SAMPLERS:
        raise ValueError(f"OTEL_TRACES_SAMPLER={name!r}: expected one of {', '.join(_SAMPLERS)}")
    raw = environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    try:
        ratio = float(raw) if raw else 1.0
    except ValueError:
        raise ValueError(f"OTEL_TRACES_SAMPLER_ARG={raw!r}: expected a number in [0, 1]") from None
    return _SAMPLERS[name](ratio)


def identity_context(session_id: str, trajectory_id: str, harness: str,
                     parent: context.Context | None = None) -> context.Context:
    """``parent`` (default: the current context) with the request's identity as baggage."""
    ctx = parent if parent is not None else context.get_current()
    for key, value in ((SESSION, session_id), (TRAJECTORY, trajectory_id), (HARNESS, harness)):
        if value:
            ctx = baggage.set_baggage(key, value, ctx)
    return ctx


def current_identity(ctx: context.Context | None = None) -> dict[str, str]:
    """The identity entries of the baggage in ``ctx`` (default: the current context)."""
    entries = baggage.get_all(ctx)
    return {key: str(entries[key]) for key in IDENTITY_KEYS if key in entries}


class IdentitySpanProcessor(SpanProcessor):
    """Copies the request's identity onto every span at start.

    Source: the parent context's baggage; failing that, the identity attributes of a local parent span
    (a span started under the gateway's root span before the baggage was attached).
    """

    def on_start(self, span: Span, parent_context: context.Context | None = None) -> None:
        found = current_identity(parent_context)
        if len(found) < len(IDENTITY_KEYS):
            parent = trace.get_current_span(parent_context)
            attrs = getattr(parent, "attributes", None)
            if attrs:
                for key in IDENTITY_KEYS:
                    if key not in found and key in attrs:
                        found[key] = str(attrs[key])
        if found:
            span.set_attributes(found)

    def on_end(self, span: ReadableSpan) -> None:
        return None

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class Tracing:
    """The process's tracer provider plus the gRPC interceptors that propagate its context."""

    def __init__(self, service_name: str, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", service_name)})
        self.provider = TracerProvider(resource=resource, sampler=sampler_from_env(env))
        self.provider.add_span_processor(IdentitySpanProcessor())
        exporter = _exporter(env)
        self._processor: SpanProcessor | None = None
        if exporter is not None:
            self._processor = BatchSpanProcessor(exporter)
            self.provider.add_span_processor(self._processor)
        trace.set_tracer_provider(self.provider)
        self.tracer = self.provider.get_tracer("harnessmesh")

    @property
    def exporting(self) -> bool:
        """True when spans leave the process."""
        return self._processor is not None

    def server_interceptors(self) -> Sequence[Any]:
        # A mux session outlives every request on it; its streams carry their own trace context.
        return [aio_server_interceptor(tracer_provider=self.provider,
                                       filter_=filters.negate(filters.service_name(MUX_SERVICE)))]

    def client_interceptors(self) -> Sequence[Any]:
        return list(aio_client_interceptors(tracer_provider=self.provider))

    def shutdown(self) -> None:
        self.provider.shutdown()
