"""Settings of the router process (``python -m services.router``)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common import worker_registry as registry
from services.common.service_settings import MeshServiceSettings
from services.common.settings import option
from services.router.footprint import DEFAULT_FOOTPRINT_WINDOW
from services.router.pending import DEFAULT_PENDING_TTL
from services.router.policy import DEFAULT_OVERLAP_WEIGHT, MODES


@dataclass(frozen=True)
class RouterSettings(MeshServiceSettings):
    """Where the router listens, where it finds workers, and how it places requests."""

    host: str = option("127.0.0.1", "Address the router's gRPC server binds.", wiring=True)
    port: int = option(50052, "gRPC port of the router (0: pick a free port).", wiring=True)
    nats_url: str = option("nats://127.0.0.1:4222", "NATS server carrying KV events and worker heartbeats.",
                           shared=True)
    nats_token: str = option("", "Token the NATS server requires (HARNESSMESH_NATS_TOKEN; `harnessmesh up` makes "
                             "one for the nats-server it starts).", shared=True, secret=True)
    router_mode: str = option("kv", "Placement policy.", choices=MODES, shared=True)
    overlap_weight: float = option(
        DEFAULT_OVERLAP_WEIGHT, "Cost weight of prefill blocks a worker would have to compute.")
    router_temperature: float = option(
        0.0, "Softmax temperature of kv placement (0: always the cheapest worker).")
    pending_prefix_ttl: float = option(
        DEFAULT_PENDING_TTL, "Seconds after a request's first token that its prompt blocks still count as held by "
        "its worker when that worker's KV events have not said so yet (they count from placement on, so "
        "requests sharing a prefix sent together land together; 0: off, only KV events count).")
    footprint_window: float = option(
        DEFAULT_FOOTPRINT_WINDOW, "Seconds after a session's last turn that its prompt still counts as its worker's "
        "live footprint: kv placement sends new sessions where live contexts leave the most KV room (0: off).")
    worker_timeout: float = option(5.0, "Seconds without a heartbeat after which a worker is forgotten.")
    registry_store: str = registry.store_option()
    registry_bucket: str = registry.bucket_option()
    max_retries: int = option(2, "Other workers to try when a worker fails before its first token.")
    migration_limit: int = option(
        3, "Times a request moves to another worker after its first token when its worker fails (0: never).")
    stall_timeout: float = option(
        30.0, "Seconds a worker may go without sending a frame of a running request before it counts as failed.")
    first_frame_timeout: float = option(
        0.0, "Seconds to wait for a worker's first frame before the request goes to another worker (0: derived "
        "per worker: twice what its recent first frames took for as much queued prefill work, plus 1 s; none "
        "before it has history).")
    queue_max_requests: int = option(
        0, "A worker is saturated with this many requests in flight from this router (0: no limit).")
    queue_threshold: float = option(
        0.0, "A worker is saturated when this share of its KV blocks is in use by this router's requests (0: off). "
             "While every worker is saturated, requests wait in a queue ordered by priority, then arrival.")

    def validate(self) -> None:
        super().validate()
        if self.overlap_weight < 0:
            raise ValueError("--overlap-weight must be >= 0")
        if self.router_temperature < 0:
            raise ValueError("--router-temperature must be >= 0")
        if self.pending_prefix_ttl < 0 or self.footprint_window < 0:
            raise ValueError("--pending-prefix-ttl and --footprint-window must be >= 0")
        if self.worker_timeout <= 0:
            raise ValueError("--worker-timeout must be > 0")
        if self.max_retries < 0:
            raise ValueError("--max-retries must be >= 0")
        if self.migration_limit < 0:
            raise ValueError("--migration-limit must be >= 0")
        if self.stall_timeout <= 0:
            raise ValueError("--stall-timeout must be > 0")
        if self.first_frame_timeout < 0:
            raise ValueError("--first-frame-timeout must be >= 0")
        if self.queue_max_requests < 0 or not 0 <= self.queue_threshold <= 1:
            raise ValueError("--queue-max-requests must be >= 0 and --queue-threshold in [0, 1]")
