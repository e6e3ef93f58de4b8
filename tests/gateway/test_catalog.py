"""The model catalog: defaults from the parse service's model info, file overrides, /v1/models metadata."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.catalog import CatalogError, ModelCatalog, default_profile
from services.api import chat_pb2
from tests.gateway.fake_parse import FakeParse

INFO = chat_pb2.ModelInfo(served_model_name="demo", max_model_len=32768, reasoning_parser="qwen3",
                          tool_parser="hermes", input_modalities=["text", "image"])


def test_defaults_follow_the_model() -> None:
    profile = default_profile(INFO, "coder")
    assert profile.context_window == 32768 and profile.max_output_tokens == 8192
    assert profile.reasoning_levels == ("low", "medium", "high") and profile.default_reasoning_level == "medium"
    assert profile.default_reasoning_summary == "auto"
    assert profile.parallel_tool_calls is True and profile.input_modalities == ("text", "image")
    assert profile.display_name == "coder"
    plain = default_profile(chat_pb2.ModelInfo(served_model_name="p", max_model_len=4096))
    assert plain.reasoning_levels == () and plain.default_reasoning_level is None
    assert plain.default_reasoning_summary == "none" and plain.parallel_tool_calls is False
    assert plain.input_modalities == ("text",) and plain.max_output_tokens == 1024


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_file_overrides_star_then_model(tmp_path: Path, suffix: str) -> None:
    data = {"models": {"*": {"truncation_policy": {"mode": "bytes", "limit": 5000}, "max_output_tokens": 100},
                       "demo": {"max_output_tokens": 2048, "reasoning_levels": ["low", "high"],
                                "default_reasoning_level": "high", "base_instructions": "Be terse."}}}
    path = tmp_path / f"catalog{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(data))
    else:
        import yaml

        path.write_text(yaml.safe_dump(data))
    profile = ModelCatalog.load(path).profile(INFO)
    assert profile.max_output_tokens == 2048
    assert profile.truncation_policy == {"mode": "bytes", "limit": 5000}
    assert profile.reasoning_levels == ("low", "high") and profile.default_reasoning_level == "high"
    meta = profile.metadata()
    assert meta["base_instructions"] == "Be terse."
    assert meta["parsers"] == {"reasoning": "qwen3", "tool": "hermes"}


@pytest.mark.parametrize(("data", "fragment"), [
    ({"models": {"demo": {"context_windw": 5}}}, "unknown keys ['context_windw']"),
    ({"models": {"demo": {"context_window": 0}}}, "context_window must be a positive integer"),
    ({"models": {"demo": {"truncation_policy": {"mode": "lines", "limit": 3}}}}, "truncation_policy"),
    ({"models": {"demo": {"default_reasoning_summary": "long"}}}, "default_reasoning_summary"),
    ({"models": {"demo": {"reasoning_levels": "high"}}}, "reasoning_levels"),
    ({"demo": {}}, "'models' mapping"),
])
def test_invalid_entries_are_named(data: dict[str, Any], fragment: str) -> None:
    with pytest.raises(CatalogError) as info:
        ModelCatalog.parse(data, "cat.yaml")
    assert fragment in str(info.value) and "cat.yaml" in str(info.value)


def test_unreadable_file(tmp_path: Path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("models: [unclosed")
    with pytest.raises(CatalogError, match="cannot read model catalog"):
        ModelCatalog.load(bad)


async def test_models_endpoint_carries_the_metadata(gateway_factory: Any, fake_parse: tuple[FakeParse, str],
                                                    tmp_path: Path) -> None:
    fake, address = fake_parse
    fake.model = INFO
    path = tmp_path / "catalog.yaml"
    path.write_text("models:\n  demo:\n    max_output_tokens: 4000\n    parallel_tool_calls: false\n")
    gateway = await gateway_factory(address, model_catalog=str(path))
    async with httpx.AsyncClient(base_url=gateway.http_url, timeout=10) as http:
        listing = (await http.get("/v1/models")).json()
        single = (await http.get("/v1/models/demo")).json()
    card = listing["data"][0]
    assert card == single
    assert card["context_window"] == 32768 and card["max_output_tokens"] == 4000
    assert card["supports_parallel_tool_calls"] is False
    assert card["reasoning"] == {"supported_levels": ["low", "medium", "high"], "default_level": "medium",
                                 "default_summary": "auto"}
    assert card["truncation_policy"] == {"mode": "tokens", "limit": 10000}
    assert card["input_modalities"] == ["text", "image"]
