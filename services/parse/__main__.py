"""``python -m services.parse``: run the parse service."""

from services.common.runtime import run_service
from services.common.settings import parse_settings
from services.parse.server import serve
from services.parse.settings import ParseSettings

if __name__ == "__main__":
    settings = parse_settings(ParseSettings, "parse", prog="python -m services.parse")
    run_service("parse", settings, serve)
