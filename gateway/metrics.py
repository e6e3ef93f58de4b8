"""The gateway's Prometheus metrics: what clients experience, per model and API."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.admission import Admission
from services.common.metrics import LATENCY_BUCKETS, RATIO_BUCKETS, CounterCallback, GaugeCallback

_LABELS = ("model", "api")


class GatewayMetrics:
    """Request latency (TTFT, inter-token, end to end), cache reuse and tool timing, in one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("harnessmesh_ttft_seconds", "Time to first token (reasoning, text or tool call).",
                              _LABELS, buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("harnessmesh_inter_token_latency_seconds",
                             "Mean gap between output tokens of one request (first to last token).",
                             _LABELS, buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("harnessmesh_e2e_seconds", "Request duration, arrival to last event.",
                             _LABELS, buckets=LATENCY_BUCKETS, registry=r)
        self.cached_ratio = Histogram("harnessmesh_cached_token_ratio",
                                      "Share of each prompt served from a worker's prefix cache.",
                                      _LABELS, buckets=RATIO_BUCKETS, registry=r)
        self.prompt_tokens = Counter("harnessmesh_prompt_tokens", "Prompt tokens.", _LABELS, registry=r)
        self.cached_tokens = Counter("harnessmesh_cached_tokens", "Prompt tokens served from prefix caches.",
                                     _LABELS, registry=r)
        self.completion_tokens = Counter("harnessmesh_completion_tokens", "Generated tokens.", _LABELS, registry=r)
        self.requests = Counter("harnessmesh_requests", "Finished requests by outcome (ok, error, cancelled).",
                                (*_LABELS, "outcome"), registry=r)
        self.active = Gauge("harnessmesh_active_requests", "Requests in flight at the gateway.", ("api",),
                            registry=r)
        self.tool_dispatch_lead = Histogram(
            "harnessmesh_tool_dispatch_lead_seconds",
            "How much earlier a tool call was dispatched than its turn ended (dispatch -> end of turn).",
            _LABELS, buckets=LATENCY_BUCKETS, registry=r)
        self.harness_tool = Histogram(
            "harnessmesh_harness_tool_seconds", "The harness's tool time: our dispatch -> the tool result's arrival.",
            ("harness",), buckets=LATENCY_BUCKETS, registry=r)

    def watch_admission(self, admission: Admission) -> None:
        """The admission's slots, queue and refusals, read at scrape time."""
        self.registry.register(GaugeCallback(
            "harnessmesh_admission_turns", "Chat turns holding a slot (running) and waiting for one (queued).",
            ("state",), lambda: {("running",): float(admission.active), ("queued",): float(admission.queued)}))
        self.registry.register(CounterCallback(
            "harnessmesh_admission_refused", "Chat turns refused as overload (429 / 529 / RESOURCE_EXHAUSTED).",
            (), lambda: {(): float(admission.refused)}))
