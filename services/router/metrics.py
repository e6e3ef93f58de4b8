"""The router's Prometheus metrics: decisions, the admission queue, per-worker load as this router sees it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import reduce
from operator import xor

from prometheus_client import CollectorRegistry, Counter, Histogram

from services.common.metrics import LATENCY_BUCKETS, GaugeCallback
from services.router.index import KvIndex
from services.router.pending import PendingPrefixes
from services.router.registry import WorkerRegistry

DIGEST_MASK = (1 << 52) - 1


class RouterMetrics:
    """Routing decisions by mode and reason, queue depth and wait, active requests and KV blocks per worker."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.decisions = Counter("harnessmesh_router_decisions", "Placement decisions by routing mode and reason.",
                                 ("mode", "reason"), registry=r)
        self.queue_wait = Histogram("harnessmesh_router_queue_wait_seconds",
                                    "Time requests waited in the admission queue (0 when not queued).",
                                    buckets=LATENCY_BUCKETS, registry=r)

    def watch_index(self, index: KvIndex) -> None:
        """Scrape-time gauges of the KV index per worker: its block count and :func:`index_digest`, read-only
        (``blocks`` copies the set in one C call, so the scrape thread never sees it change mid-read)."""
        self.registry.register(GaugeCallback(
            "harnessmesh_router_index_blocks", "Blocks the KV index holds per worker.", ("worker",),
            lambda: {(w,): float(index.block_count(w)) for w in index.workers()}))
        self.registry.register(GaugeCallback(
            "harnessmesh_router_index_digest", "XOR of the block hashes the KV index holds per worker (low 52 "
            "bits): equal across router replicas, and to the worker's own block set, when they agree.", ("worker",),
            lambda: {(w,): float(index_digest(index.blocks(w))) for w in index.workers()}))

    def watch(self, workers: WorkerRegistry, queue_depth: Callable[[], int],
              pending: PendingPrefixes | None = None) -> None:
        """Scrape-time gauges over the live registry, the admission queue and the pending-prefix index."""

        def loads(attr: str) -> dict[tuple[str, ...], float]:
            return {(ep.worker_id,): float(getattr(workers.load(ep.worker_id), attr)) for ep in workers.endpoints()}

        self.registry.register(GaugeCallback("harnessmesh_router_queue_depth", "Requests waiting for a worker.", (),
                                             lambda: {(): float(queue_depth())}))
        self.registry.register(GaugeCallback("harnessmesh_router_worker_active_requests",
                                             "Requests this router has in flight per worker.", ("worker",),
                                             lambda: loads("requests")))
        self.registry.register(GaugeCallback("harnessmesh_router_worker_active_blocks",
                                             "KV blocks this router's requests occupy per worker.", ("worker",),
                                             lambda: loads("active_blocks")))
        self.registry.register(GaugeCallback(
            "harnessmesh_router_worker_total_blocks", "KV capacity per worker in blocks.", ("worker",),
            lambda: {(ep.worker_id,): float(ep.total_blocks) for ep in workers.endpoints()}))
        if pending is not None:
            self.registry.register(GaugeCallback(
                "harnessmesh_router_worker_predicted_blocks",
                "Blocks the pending-prefix index predicts per worker (placed, not yet in its KV events).", ("worker",),
                lambda: {(ep.worker_id,): float(pending.predicted_blocks(ep.worker_id)) for ep in workers.endpoints()}))


def index_digest(block_hashes: Iterable[int]) -> int:
    """An order-free digest of a block set (XOR of the hashes, low 52 bits: exact as a float gauge), so two
    routers' indexes, or an index and a worker's ``KvRecovery.Dump``, compare by scraping."""
    return reduce(xor, block_hashes, 0) & DIGEST_MASK


def decision_reason(mode: str, overlap_blocks: int, candidates: int, *, target: bool, retry: bool,
                    migration: bool, predicted_blocks: int = 0) -> str:
    """Why the chosen worker was chosen, as a small closed set of label values (``kv_predicted``: part of the
    overlap was known only from the pending-prefix index)."""
    if migration:
        return "migration"
    if retry:
        return "retry"
    if target:
        return "target_worker"
    if candidates == 1:
        return "only_worker"
    if mode != "kv":
        return mode
    if predicted_blocks > 0:
        return "kv_predicted"
    return "kv_overlap" if overlap_blocks > 0 else "kv_load"
