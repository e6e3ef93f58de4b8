"""Settings of ``harnessmesh up`` itself; every service option is added on top of these."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.service_settings import ProcessSettings
from services.common.settings import option


@dataclass(frozen=True)
class LauncherSettings(ProcessSettings):
    """How many workers to start, which NATS to use, and how long to wait for the mesh."""

    workers: int = option(1, "Number of worker processes.")
    nats_url: str = option("", "Use this NATS server instead of starting one (empty: start nats-server).",
                           shared=True)
    nats_port: int = option(0, "Port of the nats-server the launcher starts (0: pick a free port).")
    startup_timeout: float = option(60.0, "Seconds to wait for every service to become healthy.")

    def validate(self) -> None:
        if self.workers < 1:
            raise ValueError("--workers must be at least 1")
        if self.startup_timeout <= 0:
            raise ValueError("--startup-timeout must be > 0")
