"""``python -m gateway``: the HTTP + gRPC edge of the mesh."""

from services.common.grpc_io import choose_grpc_io

if __name__ == "__main__":
    choose_grpc_io()  # before anything imports grpc (services/common/grpc_io.py)
    from gateway.server import serve
    from gateway.settings import GatewaySettings
    from services.common.runtime import run_service
    from services.common.settings import parse_settings

    settings = parse_settings(GatewaySettings, "gateway", prog="python -m gateway")
    run_service("gateway", settings, serve)
