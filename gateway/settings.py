"""Settings of the gateway process (``python -m gateway``)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.service_settings import CommonSettings
from services.common.settings import option


@dataclass(frozen=True)
class GatewaySettings(CommonSettings):
    """HTTP and gRPC edge of the mesh: OpenAI-compatible API plus the AgentService gRPC API."""

    host: str = option("127.0.0.1", "Interface the HTTP and gRPC edges listen on.")
    http_port: int = option(8000, "HTTP port of the OpenAI-compatible API (0: pick a free port).")
    grpc_port: int = option(8001, "gRPC port of the AgentService edge API (0: pick a free port).")
    parse_address: str = option("127.0.0.1:50051", "host:port of the parse service.", wiring=True)
    served_model_name: str = option(
        "", "Model name clients use (empty: whatever the parse service reports).", shared=True
    )
    api_key: list[str] = option(  # noqa: RUF009 - option() builds a default_factory
        [], "Accepted API key (Authorization: Bearer KEY or x-api-key). None given: no auth.",
        metavar="KEY",
        secret=True,
    )
    request_timeout: float = option(600.0, "Deadline in seconds of one request to the parse service.")

    def validate(self) -> None:
        for name in ("http_port", "grpc_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise ValueError(f"{name} must be in 0..65535, got {port}")
        if self.request_timeout <= 0:
            raise ValueError(f"request_timeout must be positive, got {self.request_timeout}")
