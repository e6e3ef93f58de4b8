"""Options every service has, as a base for each service's frozen settings dataclass."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.settings import option

LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class CommonSettings:
    """Logging and namespace options shared by every process of the mesh."""

    log_level: str = option("info", "Log level.", shared=True, choices=LOG_LEVELS)
    log_format: str = option("json", "Log format: json lines or human-readable console.", shared=True,
                             choices=("json", "console"))
    namespace: str = option("default", "Mesh namespace: scopes NATS subjects so meshes can share a NATS.",
                            shared=True)
