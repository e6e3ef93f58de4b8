"""Parse settings: flags, env twins, parser-name validation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from services.common.model_dir import DEMO_MODEL_DIR, SERVING_FILE, ModelDirError, load_model_dir
from services.common.settings import parse_settings
from services.parse.model_format import ModelFormat
from services.parse.parsers.registry import UnknownParserError
from services.parse.server import build_model_format
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


def test_the_model_directory_names_its_parsers_and_the_flags_override_them(tmp_path: Path) -> None:
    """The demo model's ``harnessmesh.json``: served as ``demo`` with its Qwen3-style parsers, no flags needed."""
    fmt = build_model_format(ParseSettings())
    assert (fmt.served_model_name, fmt.reasoning_parser, fmt.tool_parser) == ("demo", "qwen3", "hermes")
    fmt = build_model_format(ParseSettings(served_model_name="m", reasoning_parser="deepseek_r1", tool_parser="none"))
    assert (fmt.served_model_name, fmt.reasoning_parser, fmt.tool_parser) == ("m", "deepseek_r1", "")
    assert parse_settings(ParseSettings, "parse", ["--reasoning-parser", "none"], {}).reasoning_parser == "none"

    plain = tmp_path / "plain"  # a directory without harnessmesh.json: its name, no parsers
    shutil.copytree(DEMO_MODEL_DIR, plain)
    (plain / SERVING_FILE).unlink()
    fmt = build_model_format(ParseSettings(model=str(plain)))
    assert (fmt.served_model_name, fmt.reasoning_parser, fmt.tool_parser) == ("plain", "", "")

    (plain / SERVING_FILE).write_text(json.dumps({"tool_parser": "nope"}))
    with pytest.raises(UnknownParserError, match="hermes"):
        build_model_format(ParseSettings(model=str(plain)))
    for bad, needle in (({"parser": "x"}, "unknown keys"), ({"tool_parser": 1}, "must be strings"), ([], "object")):
        (plain / SERVING_FILE).write_text(json.dumps(bad))
        with pytest.raises(ModelDirError, match=needle):
            load_model_dir(plain)
