"""Prometheus metrics: one registry per process, served at ``/metrics``.

gRPC-only services (parse, router, worker) serve their registry on ``--metrics-port`` with
prometheus_client's own HTTP server (a daemon thread: scrapes never touch the event loop); the gateway
also serves it on its HTTP port. Gauges that describe state (queue depth, active requests, KV blocks)
are read at scrape time through callbacks, so the request path pays nothing for them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from wsgiref.simple_server import WSGIServer

import structlog
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = structlog.get_logger()

# Latency buckets (seconds) from sub-millisecond inter-token gaps to multi-minute agent turns.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0, 300.0)
RATIO_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)


class MetricsServer:
    """prometheus_client's HTTP endpoint for one registry (``port`` 0 in the constructor: a free port)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._server: WSGIServer
        self._thread: threading.Thread
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        self.port: int = self._server.server_port
        bound = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        self.url = f"http://{bound}:{self.port}/metrics"
        log.info("metrics.listening", url=self.url)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> MetricsServer | None:
    """Start the endpoint when ``port`` > 0 (the ``--metrics-port`` convention: 0 is off)."""
    return MetricsServer(registry, host, port) if port > 0 else None


class GaugeCallback(Collector):
    """Gauges computed at scrape time: ``read()`` returns ``{label values: value}`` per gauge."""

    family: type[GaugeMetricFamily] | type[CounterMetricFamily] = GaugeMetricFamily

    def __init__(self, name: str, documentation: str, labels: Iterable[str],
                 read: Callable[[], dict[tuple[str, ...], float]]) -> None:
        self._name = name
        self._doc = documentation
        self._labels = list(labels)
        self._read = read

    def collect(self) -> Iterable[Metric]:
        family = self.family(self._name, self._doc, labels=self._labels)
        for labels, value in self._read().items():
            family.add_metric(list(labels), value)
        yield family


class CounterCallback(GaugeCallback):
    """Counters kept elsewhere (plain ints), read at scrape time like :class:`GaugeCallback`."""

    family = CounterMetricFamily
