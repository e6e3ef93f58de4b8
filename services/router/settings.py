"""Settings of the router process (``python -m services.router``)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.service_settings import CommonSettings
from services.common.settings import option

ROUTING_MODES = ("kv", "round-robin", "random", "least-loaded")


@dataclass(frozen=True)
class RouterSettings(CommonSettings):
    """Where the router listens, where it finds workers, and how it places requests."""

    host: str = option("127.0.0.1", "Address the router's gRPC server binds.", wiring=True)
    port: int = option(50052, "gRPC port of the router (0: pick a free port).", wiring=True)
    nats_url: str = option("nats://127.0.0.1:4222", "NATS server carrying KV events and worker heartbeats.",
                           shared=True)
    router_mode: str = option("kv", "Placement policy.", choices=ROUTING_MODES, shared=True)
    overlap_weight: float = option(1.0, "Cost weight of prefill blocks a worker would have to compute.")
    worker_timeout: float = option(5.0, "Seconds without a heartbeat after which a worker is forgotten.")
    max_retries: int = option(2, "Other workers to try when a worker fails before its first token.")

    def validate(self) -> None:
        if self.overlap_weight < 0:
            raise ValueError("--overlap-weight must be >= 0")
        if self.worker_timeout <= 0:
            raise ValueError("--worker-timeout must be > 0")
        if self.max_retries < 0:
            raise ValueError("--max-retries must be >= 0")
