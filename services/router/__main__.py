"""``python -m services.router``: the KV-aware router."""

from services.common.grpc_io import choose_grpc_io

if __name__ == "__main__":
    choose_grpc_io()  # before anything imports grpc (services/common/grpc_io.py)
    from services.common.runtime import run_service
    from services.common.settings import parse_settings
    from services.router.server import serve
    from services.router.settings import RouterSettings

    run_service("router", parse_settings(RouterSettings, "router", prog="python -m services.router"), serve)
