"""``python -m gateway``: the HTTP + gRPC edge of the mesh."""

from gateway.server import serve
from gateway.settings import GatewaySettings
from services.common.runtime import run_service
from services.common.settings import parse_settings

if __name__ == "__main__":
    settings = parse_settings(GatewaySettings, "gateway", prog="python -m gateway")
    run_service("gateway", settings, serve)
