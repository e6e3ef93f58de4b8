"""OpenTelemetry set up once per process, configured by the standard ``OTEL_*`` env vars.

Exporter choice: ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console`` or ``none``). When it is unset,
spans are exported over OTLP only if ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the traces-specific
endpoint) is set, so a laptop without a collector stays quiet. ``OTEL_EXPORTER_OTLP_PROTOCOL``
picks ``grpc`` (default) or ``http/protobuf``. Spans go through a batch processor, so a collector
that is down never blocks a request. W3C trace context crosses gRPC hops in metadata through the
interceptors returned here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.instrumentation.grpc import aio_client_interceptors, aio_server_interceptor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter


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


class Tracing:
    """The process's tracer provider plus the gRPC interceptors that propagate its context."""

    def __init__(self, service_name: str, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", service_name)})
        self.provider = TracerProvider(resource=resource)
        exporter = _exporter(env)
        self._processor: SpanProcessor | None = None
        if exporter is not None:
            self._processor = BatchSpanProcessor(exporter)
            self.provider.add_span_processor(self._processor)
        trace.set_tracer_provider(self.provider)
        self.tracer = self.provider.get_tracer("harnessmesh")

    def server_interceptors(self) -> Sequence[Any]:
        return [aio_server_interceptor(tracer_provider=self.provider)]

    def client_interceptors(self) -> Sequence[Any]:
        return list(aio_client_interceptors(tracer_provider=self.provider))

    def shutdown(self) -> None:
        self.provider.shutdown()
