"""``python -m services.worker``: serve one engine behind the Worker gRPC service."""

from services.common.grpc_io import choose_grpc_io

if __name__ == "__main__":
    choose_grpc_io()  # before anything imports grpc (services/common/grpc_io.py)
    from services.common.runtime import run_service
    from services.common.settings import parse_settings
    from services.worker.server import serve
    from services.worker.settings import WorkerSettings

    settings = parse_settings(WorkerSettings, "worker", prog="python -m services.worker")
    run_service("worker", settings, serve)
