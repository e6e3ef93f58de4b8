"""Settings of the ``harnessmesh`` commands that the launcher runs itself: ``up`` and ``catalog``.

``harnessmesh replay``'s settings belong to the replay package (:mod:`services.replay.settings`).
Env names follow every service's: ``HARNESSMESH_UP_<OPTION>``, ``HARNESSMESH_CATALOG_<OPTION>``.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.service_settings import ProcessSettings
from services.common.settings import option

CODEX_CATALOG_PATH = "~/.codex/harnessmesh-models.json"


@dataclass(frozen=True)
class UpSettings(ProcessSettings):
    """How many workers to start, which NATS to use, and how long to wait for the mesh."""

    workers: int = option(1, "Number of worker processes.")
    nats_url: str = option("", "Use this NATS server instead of starting one (empty: start nats-server).",
                           shared=True)
    nats_token: str = option(
        "", "Token the NATS server requires (HARNESSMESH_NATS_TOKEN; with --nats-url: that server's token; "
        "otherwise one is made for the nats-server started here).", shared=True, secret=True)
    nats_port: int = option(0, "Port of the nats-server the launcher starts (0: pick a free port).")
    startup_timeout: float = option(60.0, "Seconds to wait for every service to become healthy.")
    restart: str = option("on-failure", "What to do when a service process dies: start it again (with backoff; "
                          "more than 5 deaths in 60 s stop the mesh) or stop the mesh.",
                          choices=("on-failure", "never"))

    def validate(self) -> None:
        if self.workers < 1:
            raise ValueError("--workers must be at least 1")
        if self.startup_timeout <= 0:
            raise ValueError("--startup-timeout must be > 0")


@dataclass(frozen=True)
class CatalogSettings:
    """Which gateway to ask for its model cards, and what to print (the harness is the positional argument)."""

    url: str = option("http://127.0.0.1:8000", "The gateway's HTTP URL.")
    model: str = option("", "Served model name (empty: the mesh's first model).")
    api_key: str = option("", "API key for GET /v1/models, if the gateway needs one.", secret=True)
    catalog_path: str = option(CODEX_CATALOG_PATH, "codex: where config.toml expects the catalog file.")
    only: str | None = option(None, "Print only the machine-readable catalog or only the config (default: both).",
                              choices=("catalog", "config"))
