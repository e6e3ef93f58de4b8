"""The worker's Prometheus metrics: per-request counters plus the engine's load, read at scrape time."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram

from services.common.metrics import LATENCY_BUCKETS, CounterCallback, GaugeCallback
from services.worker.engine import Engine


class WorkerMetrics:
    """Requests, tokens, queue and prefill time; active requests, queue depth and KV blocks of the engine."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter("harnessmesh_worker_requests", "Finished requests by finish reason.",
                                ("finish_reason",), registry=r)
        self.prompt_tokens = Counter("harnessmesh_worker_prompt_tokens", "Prompt tokens.", registry=r)
        self.cached_tokens = Counter("harnessmesh_worker_cached_tokens", "Prompt tokens from the prefix cache.",
                                     registry=r)
        self.generated_tokens = Counter("harnessmesh_worker_generated_tokens", "Generated tokens.", registry=r)
        self.queue = Histogram("harnessmesh_worker_queue_seconds", "Wait for admission into the batch.",
                               buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("harnessmesh_worker_ttft_seconds", "Arrival at the worker to the first output.",
                              buckets=LATENCY_BUCKETS, registry=r)

    def watch(self, engine: Engine, worker_id: str) -> None:
        """Engine load as gauges labelled by worker, computed from ``engine.stats()`` on each scrape."""

        def stats() -> dict[str, float]:
            st = engine.stats()
            return {"active_requests": st.active_requests, "running_requests": st.running_requests,
                    "waiting_requests": st.waiting_requests, "kv_active_blocks": st.active_blocks,
                    "kv_cached_blocks": st.cached_blocks, "kv_total_blocks": st.total_blocks}

        docs = {"active_requests": "Requests running or waiting.", "running_requests": "Requests in the batch.",
                "waiting_requests": "Queue depth: requests waiting for admission.",
                "kv_active_blocks": "KV blocks referenced by requests.",
                "kv_cached_blocks": "Unreferenced KV blocks kept for prefix reuse.",
                "kv_total_blocks": "KV capacity in blocks."}
        def reader(key: str) -> Callable[[], dict[tuple[str, ...], float]]:
            return lambda: {(worker_id,): float(stats()[key])}

        for key, doc in docs.items():
            self.registry.register(GaugeCallback(f"harnessmesh_worker_{key}", doc, ("worker",), reader(key)))

        prefix = "kv_events_skipped_"

        def skipped() -> dict[tuple[str, ...], float]:
            extra = engine.stats().extra
            return {(worker_id, k[len(prefix):]): v for k, v in extra.items() if k.startswith(prefix)}

        def retention(key: str) -> Callable[[], dict[tuple[str, ...], float]]:
            def read() -> dict[tuple[str, ...], float]:
                value = engine.stats().extra.get(f"kv_retention_{key}")
                return {} if value is None else {(worker_id,): value}
            return read

        self.registry.register(GaugeCallback(
            "harnessmesh_worker_kv_leased_blocks", "Inactive KV blocks under a retention lease (a session's tool "
            "wait, cache_control; docs/agent-kv.md).", ("worker",), retention("held_blocks")))
        for key, doc in (("leases", "Requests whose KV blocks were leased when they ended."),
                         ("lease_hits", "Admissions that reused KV blocks under a live lease."),
                         ("hit_blocks", "KV blocks reused under a live lease (kept past plain LRU order)."),
                         ("broken_blocks", "Leased KV blocks evicted before their lease ended (nothing else left)."),
                         ("marked_blocks", "KV blocks marked to go first (a finished sub-agent, a closed session).")):
            self.registry.register(CounterCallback(f"harnessmesh_worker_kv_retention_{key}", doc, ("worker",),
                                                   retention(key)))

        self.registry.register(CounterCallback(
            "harnessmesh_worker_kv_events_skipped", "Engine KV events not published, by reason (trtllm: "
            "multimodal blocks, whose token ids are item digests).", ("worker", "reason"), skipped))
