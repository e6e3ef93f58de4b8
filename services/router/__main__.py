"""``python -m services.router``: the KV-aware router."""

from services.common.runtime import run_service
from services.common.settings import parse_settings
from services.router.server import serve
from services.router.settings import RouterSettings

if __name__ == "__main__":
    run_service("router", parse_settings(RouterSettings, "router", prog="python -m services.router"), serve)
