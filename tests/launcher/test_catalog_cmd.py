"""``harnessmesh catalog HARNESS``: config for Codex, Claude Code, pi and OpenClaw from a gateway's model cards."""

from __future__ import annotations

import asyncio
import json
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.server import Gateway
from gateway.settings import GatewaySettings
from services.api import chat_pb2
from services.launcher.cli import main
from tests.gateway.fake_parse import FakeParse, start_fake_parse
from tests.support.fixtures import CODEX_MODEL_CATALOG
from tests.support.nats import free_port


async def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = await asyncio.to_thread(main, ["catalog", *argv])
    assert code == 0
    return capsys.readouterr().out


@pytest.fixture
async def served() -> AsyncIterator[str]:
    """A gateway over a fake parse service serving a reasoning + tools model; yields its URL."""
    fake = FakeParse()
    fake.model = chat_pb2.ModelInfo(served_model_name="demo", max_model_len=32768, reasoning_parser="qwen3",
                                    tool_parser="hermes", input_modalities=["text"])
    server, address = await start_fake_parse(fake)
    gateway = Gateway(GatewaySettings(http_port=0, grpc_port=0, parse_address=address), tracing=None)
    await gateway.start()
    yield gateway.http_url
    await gateway.stop()
    await server.stop(0)


async def test_codex_catalog_and_config(served: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    catalog = json.loads(await run_cli(capsys, "codex", "--url", served + "/v1", "--only", "catalog"))
    entry = catalog["models"][0]
    assert entry["slug"] == "demo" and entry["context_window"] == 32768
    assert entry["supported_reasoning_levels"][1] == {"effort": "medium",
                                                      "description": "Balances speed and reasoning depth"}
    assert entry["default_reasoning_level"] == "medium" and entry["apply_patch_tool_type"] is None
    assert entry["base_instructions"]
    template = json.loads(CODEX_MODEL_CATALOG.read_text())["models"][0]  # every field Codex 0.169.0's entry has
    assert set(template) <= set(entry), set(template) - set(entry)
    config = tomllib.loads(await run_cli(capsys, "codex", "--url", served, "--only", "config",
                                         "--catalog-path", str(tmp_path / "c.json")))
    assert config["model"] == "demo" and config["model_provider"] == "harnessmesh"
    assert config["model_catalog_json"] == str(tmp_path / "c.json")
    provider = config["model_providers"]["harnessmesh"]
    assert provider["base_url"] == served + "/v1" and provider["wire_api"] == "responses"
    both = await run_cli(capsys, "codex", "--url", served)
    assert "[model_providers.harnessmesh]" in both and '"slug": "demo"' in both
    # the default output is the two files one after the other: config.toml, then the catalog JSON
    toml_part, _, rest = both.partition("\n\n# ")
    path, _, json_part = rest.partition("\n")
    assert tomllib.loads(toml_part)["model_catalog_json"] == path
    assert json.loads(json_part)["models"][0]["slug"] == "demo"


async def test_claude_code_pi_openclaw(served: str, capsys: pytest.CaptureFixture[str]) -> None:
    env = await run_cli(capsys, "claude-code", "--url", served)
    assert f"export ANTHROPIC_BASE_URL={served}\n" in env and "export ANTHROPIC_MODEL=demo" in env
    assert "CLAUDE_CODE_MAX_OUTPUT_TOKENS=8192" in env
    pi: Any = json.loads(await run_cli(capsys, "pi", "--url", served, "--only", "catalog"))
    model = pi["providers"]["harnessmesh"]["models"][0]
    assert model == {"id": "demo", "name": "demo", "reasoning": True, "input": ["text"], "contextWindow": 32768,
                     "maxTokens": 8192, "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}}
    # one provider per API (the Anthropic SDK appends /v1/messages to its base URL itself)
    assert {name: (p["api"], p["baseUrl"]) for name, p in pi["providers"].items()} == {
        "harnessmesh": ("openai-completions", served + "/v1"),
        "harnessmesh-responses": ("openai-responses", served + "/v1"),
        "harnessmesh-anthropic": ("anthropic-messages", served)}
    claw: Any = json.loads(await run_cli(capsys, "openclaw", "--url", served, "--only", "catalog"))
    assert claw["agents"]["defaults"]["model"]["primary"] == "harnessmesh/demo"
    assert claw["models"]["providers"]["harnessmesh"]["baseUrl"] == served + "/v1"
    assert claw["models"]["providers"]["harnessmesh-anthropic"]["api"] == "anthropic-messages"


def _exports(text: str) -> dict[str, str]:
    return dict(line.removeprefix("export ").split("=", 1) for line in text.splitlines() if line.startswith("export "))


async def test_claude_code_gets_every_model_variable_it_reads(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeParse()
    server, address = await start_fake_parse(fake)
    plain = Gateway(GatewaySettings(http_port=0, grpc_port=0, parse_address=address), tracing=None)
    aliased = Gateway(GatewaySettings(http_port=0, grpc_port=0, parse_address=address,
                                      model_alias=["mock-model=demo", "gpt-*=demo", "claude-*=demo"]), tracing=None)
    await plain.start()
    await aliased.start()
    try:
        without = await run_cli(capsys, "claude-code", "--url", plain.http_url)
        with_alias = await run_cli(capsys, "claude-code", "--url", aliased.http_url)
    finally:
        await plain.stop()
        await aliased.stop()
        await server.stop(0)
    exports = _exports(without)
    # main, small/fast, default Haiku / Sonnet / Opus, sub-agents, classifiers: none left to a made-up name
    for name in ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
                 "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL",
                 "CLAUDE_CODE_WORKFLOW_SUBAGENT_MODEL", "CLAUDE_CODE_AUTO_MODE_MODEL",
                 "CLAUDE_CODE_BG_CLASSIFIER_MODEL"):
        assert exports.pop(name) == "demo", name
    assert exports.pop("CLAUDE_CODE_SUBAGENT_MODEL_FORCE") == "1"  # over a definition's own model: see the e2e
    assert set(exports) == {"ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "CLAUDE_CODE_MAX_OUTPUT_TOKENS",
                            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"}
    # the names Claude Code sends on its own: how to serve them, or which alias already does
    assert "start the mesh with --model-alias 'claude-*=demo'" in without
    assert "this mesh serves them under --model-alias 'claude-*'" in with_alias
    assert set(_exports(with_alias).items()) ^ set(_exports(without).items()) == {
        ("ANTHROPIC_BASE_URL", plain.http_url), ("ANTHROPIC_BASE_URL", aliased.http_url)}


async def test_unknown_model_and_unreachable_mesh(served: str) -> None:
    with pytest.raises(SystemExit, match="does not serve 'other'"):
        await asyncio.to_thread(main, ["catalog", "pi", "--url", served, "--model", "other"])
    with pytest.raises(SystemExit, match="cannot read"):
        await asyncio.to_thread(main, ["catalog", "codex", "--url", f"http://127.0.0.1:{free_port()}"])


async def test_pi_and_openclaw_output_is_the_file_itself_and_the_key_comes_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeParse()
    server, address = await start_fake_parse(fake)
    gateway = Gateway(GatewaySettings(http_port=0, grpc_port=0, parse_address=address, api_key=["sk-catalog"]),
                      tracing=None)
    await gateway.start()
    try:
        monkeypatch.setenv("HARNESSMESH_API_KEY", "sk-catalog")  # the key the harness config refers to
        capsys.readouterr()  # the gateway's own start-up lines
        for harness in ("pi", "openclaw"):
            code = await asyncio.to_thread(main, ["catalog", harness, "--url", gateway.http_url])
            captured = capsys.readouterr()
            assert code == 0
            json.loads(captured.out)  # the whole of stdout is valid JSON: `> models.json` just works
            assert captured.err.startswith("# ")  # where to put it goes to stderr
    finally:
        await gateway.stop()
        await server.stop(0)
