"""``python -m services.parse``: run the parse service."""

from services.common.grpc_io import choose_grpc_io

if __name__ == "__main__":
    choose_grpc_io()  # before anything imports grpc (services/common/grpc_io.py)
    from services.common.runtime import run_service
    from services.common.settings import parse_settings
    from services.parse.server import serve
    from services.parse.settings import ParseSettings

    settings = parse_settings(ParseSettings, "parse", prog="python -m services.parse")
    run_service("parse", settings, serve)
