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

Edges: a harness may send a W3C ``traceparent`` (+ ``tracestate``); :func:`incoming_parent` (HTTP) and the
gRPC instrumentation (the public ``AgentService``) make our turn a child of the harness's span, so one trace
spans the harness's loop and our hops. Baggage from outside is never taken: identity comes from the request
(``gateway.identity``), and :class:`_EdgeBaggageFilter` hides a caller's ``baggage`` from the extraction on
the public gRPC service, so nothing a client sends there rides on to the inner hops or onto spans and logs.

GenAI: :func:`conversation_attributes` gives the identity under our names and under OpenTelemetry's GenAI
semantic conventions (``gen_ai.conversation.id``, ``gen_ai.agent.*``); the gateway's chat span and the
parse spans carry them (see docs/tracing.md).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import grpc
from opentelemetry import baggage, context, trace
from opentelemetry.instrumentation.grpc import aio_client_interceptors, aio_server_interceptor, filters
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from services.api import chat_pb2
from services.common.mux import SERVICE_NAME as MUX_SERVICE

# Baggage keys == span attribute names (Jaeger tag search: session.id=...).
SESSION = "session.id"
TRAJECTORY = "trajectory.id"
HARNESS = "harness.name"
IDENTITY_KEYS = (SESSION, TRAJECTORY, HARNESS)

# OpenTelemetry GenAI semantic conventions (open-telemetry/semantic-conventions-genai, status Development).
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_PROVIDER = "gen_ai.provider.name"
GEN_AI_CONVERSATION = "gen_ai.conversation.id"
GEN_AI_AGENT_ID = "gen_ai.agent.id"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
# Our gen_ai.provider.name: not one of the well-known values, which name hosted vendors.
PROVIDER_NAME = "harnessmesh"

# The public gRPC service: its callers are clients, not mesh peers (their baggage is not taken).
EDGE_SERVICE = chat_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name
_W3C_TRACE_CONTEXT = TraceContextTextMapPropagator()


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


def sampler_for(environ: Mapping[str, str], *, exporting: bool) -> sampling.Sampler:
    """:func:`sampler_from_env`'s sampler; but a process whose spans go nowhere (no exporter) records none unless
    ``OTEL_TRACES_SAMPLER`` is set: a span never exported costs its attributes and processors for nothing (~5 %
    of a short request's CPU over the four processes, py-spy). Trace context and baggage still propagate."""
    if not exporting and not environ.get("OTEL_TRACES_SAMPLER", "").strip():
        return sampling.ALWAYS_OFF
    return sampler_from_env(environ)


def identity_context(session_id: str, trajectory_id: str, harness: str,
                     parent: context.Context | None = None) -> context.Context:
    """``parent`` (default: the current context) with the request's identity as baggage."""
    ctx = parent if parent is not None else context.get_current()
    for key, value in ((SESSION, session_id), (TRAJECTORY, trajectory_id), (HARNESS, harness)):
        if value:
            ctx = baggage.set_baggage(key, value, ctx)
    return ctx


def conversation_attributes(session_id: str, trajectory_id: str, harness: str, *,
                            anonymous: bool = False) -> dict[str, str]:
    """The identity as span attributes, under our names and the GenAI conventions' names.

    ``gen_ai.conversation.id`` is the session, ``gen_ai.agent.id`` the trajectory (one agent's line of turns:
    Claude Code's sub-agent id, Codex's thread) and ``gen_ai.agent.name`` the harness. An ``anonymous``
    session was made up by the gateway for one request: the conventions ask for no invented conversation
    id, so it gets no GenAI identity (``session.id`` still names it).
    """
    attrs = {SESSION: session_id, TRAJECTORY: trajectory_id, HARNESS: harness}
    if not anonymous:
        if session_id:
            attrs[GEN_AI_CONVERSATION] = session_id
        if trajectory_id:
            attrs[GEN_AI_AGENT_ID] = trajectory_id
    if harness:
        attrs[GEN_AI_AGENT_NAME] = harness
    return attrs


def incoming_parent(carrier: Mapping[str, str | Sequence[str]]) -> context.Context | None:
    """The caller's span as a parent context, from W3C ``traceparent`` / ``tracestate`` in ``carrier``
    (lower-case names; a header sent more than once as a list); None when there is no valid ``traceparent``.

    Only the trace context is read, into an empty context: a caller's baggage is never taken (identity comes
    from the request). The caller's sampled flag is honoured by the parent-based samplers.
    """
    if "traceparent" not in carrier:
        return None
    ctx = _W3C_TRACE_CONTEXT.extract(carrier)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


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


class _WithoutBaggage:
    """A servicer context whose call metadata lacks ``baggage``; everything else is the wrapped context's."""

    def __init__(self, wrapped: Any) -> None:
        self._wrapped = wrapped

    def invocation_metadata(self) -> tuple[Any, ...]:
        return tuple(md for md in self._wrapped.invocation_metadata() or () if md[0] != "baggage")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)


_HANDLER_KINDS: dict[str, Callable[..., grpc.RpcMethodHandler]] = {
    "unary_unary": grpc.unary_unary_rpc_method_handler, "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler, "stream_stream": grpc.stream_stream_rpc_method_handler,
}


def _hide_baggage(behavior: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(behavior):
        async def stream(request: Any, servicer_context: Any) -> AsyncIterator[Any]:
            async for response in behavior(request, _WithoutBaggage(servicer_context)):
                yield response
        return stream

    async def call(request: Any, servicer_context: Any) -> Any:
        result: Awaitable[Any] = behavior(request, _WithoutBaggage(servicer_context))
        return await result
    return call


class _EdgeBaggageFilter(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc.aio has no stubs
    """Hides a caller's ``baggage`` metadata from everything after it on :data:`EDGE_SERVICE` (the trace
    context still comes through): placed before the tracing interceptor, whose extraction then sees none."""

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method or ""  # type: ignore[attr-defined]
        if handler is None or not method.startswith(f"/{EDGE_SERVICE}/"):
            return handler
        for kind, factory in _HANDLER_KINDS.items():
            behavior = getattr(handler, kind)
            if behavior is not None:
                return factory(_hide_baggage(behavior), request_deserializer=handler.request_deserializer,
                               response_serializer=handler.response_serializer)
        return handler


def server_interceptors(provider: TracerProvider) -> list[Any]:
    """A gRPC server's tracing interceptors: a server span per call, a child of the caller's trace context
    (baggage taken from mesh peers, never from callers of :data:`EDGE_SERVICE`)."""
    # A mux session outlives every request on it; its streams carry their own trace context.
    return [_EdgeBaggageFilter(),
            aio_server_interceptor(tracer_provider=provider,
                                   filter_=filters.negate(filters.service_name(MUX_SERVICE)))]


class Tracing:
    """The process's tracer provider plus the gRPC interceptors that propagate its context."""

    def __init__(self, service_name: str, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", service_name)})
        exporter = _exporter(env)
        self.provider = TracerProvider(resource=resource, sampler=sampler_for(env, exporting=exporter is not None))
        self.provider.add_span_processor(IdentitySpanProcessor())
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
        return server_interceptors(self.provider)

    def client_interceptors(self) -> Sequence[Any]:
        return list(aio_client_interceptors(tracer_provider=self.provider))

    def shutdown(self) -> None:
        self.provider.shutdown()
