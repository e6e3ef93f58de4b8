"""Parse settings: flags, env twins, parser-name validation."""

from __future__ import annotations

import pytest

from services.common.model_dir import load_model_dir
from services.common.settings import parse_settings
from services.parse.model_format import ModelFormat
from services.parse.parsers.registry import UnknownParserError
from services.parse.settings import ParseSettings


def test_defaults_and_shared_env() -> None:
    s = parse_settings(ParseSettings, "parse", [], {"HARNESSMESH_TOOL_PARSER": "hermes",
                                                    "HARNESSMESH_MAX_MODEL_LEN": "2048"})
    assert (s.port, s.router_address, s.model, s.tool_parser, s.max_model_len) == (
        0, "127.0.0.1:50052", "", "hermes", 2048)
    assert s.strip_billing_header is True
    s = parse_settings(ParseSettings, "parse", ["--reasoning-parser", "qwen3", "--no-strip-billing-header"], {})
    assert s.reasoning_parser == "qwen3" and not s.strip_billing_header


def test_unknown_parser_is_rejected() -> None:
    with pytest.raises(SystemExit):
        parse_settings(ParseSettings, "parse", ["--tool-parser", "nope"], {})
    with pytest.raises(ValueError, match="valid"):
        ParseSettings(reasoning_parser="nope").validate()
    with pytest.raises(UnknownParserError, match="hermes"):
        ModelFormat(load_model_dir(None), tool_parser="nope")


def test_served_name_and_context_default_from_model() -> None:
    fmt = ModelFormat(load_model_dir(None))
    assert fmt.served_model_name == "demo_model" and fmt.max_model_len == 32768
    assert ModelFormat(load_model_dir(None), served_model_name="m", max_model_len=10).max_model_len == 10
