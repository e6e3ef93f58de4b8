"""A minimal in-test OTLP/gRPC trace collector: the mesh's real exporters send spans here."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span, flattened."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    start_ns: int = 0
    end_ns: int = 0
    links: tuple[tuple[str, str], ...] = ()                      # (trace_id, span_id) of each link
    events: tuple[tuple[str, dict[str, Any]], ...] = ()          # (name, attributes) of each event


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every span it receives."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:
        received = []
        for resource_spans in request.resource_spans:
            attrs = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            service = str(attrs.get("service.name", ""))
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    received.append(ReceivedSpan(
                        service, span.name, span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                        {a.key: _value(a.value) for a in span.attributes},
                        span.start_time_unix_nano, span.end_time_unix_nano,
                        tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
                        tuple((e.name, {a.key: _value(a.value) for a in e.attributes}) for e in span.events),
                    ))
        with self._lock:
            self.spans.extend(received)
        return trace_service_pb2.ExportTraceServiceResponse()

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)


@contextmanager
def running_collector() -> Iterator[tuple[str, Collector]]:
    """Yield (endpoint URL, collector) for a collector on a free loopback port."""
    collector = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", collector
    finally:
        server.stop(0)
