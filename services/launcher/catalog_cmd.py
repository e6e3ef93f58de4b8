"""``harnessmesh catalog HARNESS``: the copy-paste config that connects a harness to this mesh natively.

Reads the model cards of a running gateway (``GET /v1/models``: context window, max output tokens,
reasoning levels, truncation policy, ... from the model catalog) and prints, per harness:

- ``codex``: a ``model_catalog_json`` file and the ``config.toml`` provider block that uses it (Codex then
  compacts locally, and the gateway renders that request with the conversation's tools so it reuses the cached
  prefix; with the provider named ``"OpenAI"`` it compacts remotely through the gateway's ``compaction_trigger``
  support; docs/conversation-mapping.md, "Compaction");
- ``claude-code``: environment variables, one for every model name Claude Code reads (main, small/fast,
  default Haiku / Sonnet / Opus, sub-agents (forced over their definitions' own), classifiers), so none is a
  name the mesh does not serve;
- ``pi``: ``~/.pi/agent/models.json``;
- ``openclaw``: the ``models.providers`` / ``agents.defaults.model`` part of ``openclaw.json``.

pi and OpenClaw get one provider per API: ``harnessmesh`` (Chat Completions, the default),
``harnessmesh-responses`` (Responses) and ``harnessmesh-anthropic`` (Anthropic Messages), each with the model.

``--only catalog`` prints just the machine-readable part (Codex's catalog JSON, pi's or OpenClaw's
JSON), for scripts.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from services.common.settings import add_arguments, settings_from_namespace
from services.launcher.settings import CatalogSettings

HARNESSES = ("codex", "claude-code", "pi", "openclaw")
API_KEY_ENV = "HARNESSMESH_API_KEY"
_CODEX_LEVEL_TEXT = {
    "minimal": "Fastest responses with minimal reasoning",
    "low": "Fast responses with lighter reasoning",
    "medium": "Balances speed and reasoning depth",
    "high": "Greater reasoning depth for complex problems",
    "xhigh": "Extra high reasoning depth for complex problems",
}


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``catalog`` on the ``harnessmesh`` subcommands."""
    parser = commands.add_parser("catalog", help="print the config that connects a harness to this mesh",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("harness", choices=HARNESSES)
    add_arguments(parser, CatalogSettings, "catalog", os.environ)


def fetch_card(url: str, model: str, api_key: str = "", timeout: float = 10.0) -> dict[str, Any]:
    """The model card of ``model`` (or the first one) from ``GET {url}/v1/models``."""
    request = urllib.request.Request(url.rstrip("/").removesuffix("/v1") + "/v1/models")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            listing = json.load(reply)
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"harnessmesh catalog: cannot read {request.full_url}: {exc}") from exc
    cards: list[dict[str, Any]] = listing.get("data") or []
    for card in cards:
        if not model or card.get("id") == model:
            return card
    names = ", ".join(str(c.get("id")) for c in cards) or "none"
    raise SystemExit(f"harnessmesh catalog: the mesh does not serve {model!r} (it serves: {names})")


def codex_model_entry(card: dict[str, Any]) -> dict[str, Any]:
    """One entry of Codex's ``model_catalog_json`` (``{"models": [entry]}``) for a model card."""
    reasoning = card.get("reasoning") or {}
    levels = reasoning.get("supported_levels") or []
    summary = reasoning.get("default_summary") or "none"
    context = int(card.get("context_window") or card.get("max_model_len") or 0)
    return {
        "slug": card["id"],
        "display_name": card.get("display_name") or card["id"],
        "description": card.get("description") or "served by harnessmesh",
        "base_instructions": card.get("base_instructions") or "You are a coding agent. Use the tools.",
        "context_window": context,
        "max_context_window": context,
        "auto_compact_token_limit": None,
        "default_reasoning_level": reasoning.get("default_level"),
        "supported_reasoning_levels": [{"effort": lv, "description": _CODEX_LEVEL_TEXT.get(lv, lv)} for lv in levels],
        "supports_reasoning_summaries": bool(levels),
        "supports_reasoning_summary_parameter": bool(levels),
        "default_reasoning_summary": summary,
        "supports_reasoning_effort_updates": False,
        "truncation_policy": card.get("truncation_policy") or {"mode": "tokens", "limit": 10000},
        "supports_parallel_tool_calls": bool(card.get("supports_parallel_tool_calls")),
        "input_modalities": card.get("input_modalities") or ["text"],
        "supports_image_detail_original": False,
        "shell_type": "shell_command",
        "apply_patch_tool_type": None,
        "web_search_tool_type": "text",
        "support_verbosity": False,
        "default_verbosity": None,
        "prefer_websockets": False,
        "use_responses_lite": False,
        "tool_mode": None,
        "multi_agent_version": None,
        "multi_agent_reasoning_effort": None,
        "include_skills_usage_instructions": True,
        "include_apps_usage_instructions": False,
        "include_plugin_usage_instructions": False,
        "guardian": None,
        "node_repl_auto_review_required": False,
        "node_repl_disabled": False,
        "requires_sandboxed_review": False,
        "auto_review_model_override": None,
        "model_specialty": None,
        "comp_hash": "harnessmesh",
        "visibility": "list",
        "minimal_client_version": "0.124.0",
        "supported_in_api": True,
        "availability_nux": None,
        "upgrade": None,
        "priority": 1,
        "experimental_supported_tools": [],
        "available_in_plans": [],
        "supports_search_tool": False,
        "supports_experimental_context": False,
        "default_service_tier": None,
        "service_tiers": [],
        "additional_speed_tiers": [],
    }


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def codex(card: dict[str, Any], url: str, settings: CatalogSettings) -> tuple[str, str]:
    catalog = json.dumps({"models": [codex_model_entry(card)]}, indent=1)
    effort = (card.get("reasoning") or {}).get("default_level")
    config = "\n".join([
        f"# ~/.codex/config.toml  (save the catalog JSON as {settings.catalog_path}; export {API_KEY_ENV}=KEY)",
        f"model = {_toml(card['id'])}",
        'model_provider = "harnessmesh"',
        f"model_catalog_json = {_toml(settings.catalog_path)}",
        *([f"model_reasoning_effort = {_toml(effort)}"] if effort else []),
        "",
        "[model_providers.harnessmesh]",
        'name = "harnessmesh"',
        f"base_url = {_toml(url + '/v1')}",
        'wire_api = "responses"',
        f"env_key = {_toml(API_KEY_ENV)}",
    ])
    return catalog, config


# Every model name Claude Code (2.1.330, the pinned version) reads from its environment: the main model, the
# small/fast one (ANTHROPIC_SMALL_FAST_MODEL: the older name of the Haiku one, still read), the default Haiku /
# Sonnet / Opus, sub-agents', workflow sub-agents', and the auto-mode and background classifiers'. Each left unset
# is a name Claude Code makes up (its own current Sonnet / Haiku / Opus id), served only under a --model-alias.
CLAUDE_CODE_MODEL_VARIABLES = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "CLAUDE_CODE_SUBAGENT_MODEL",
    "CLAUDE_CODE_WORKFLOW_SUBAGENT_MODEL",
    "CLAUDE_CODE_AUTO_MODE_MODEL",
    "CLAUDE_CODE_BG_CLASSIFIER_MODEL",
)
CLAUDE_MODEL_EXAMPLE = "claude-haiku-4-5-20251001"  # a name a sub-agent definition may give as its model


def _alias_covering(card: dict[str, Any], name: str) -> str | None:
    """The first alias of ``card`` (as ``GET /v1/models`` lists them) that serves ``name``, if any."""
    aliases = card.get("aliases") or []
    for alias in sorted(aliases, key=lambda a: bool(a.get("pattern"))):  # exact names first, as the gateway
        pattern = str(alias["name"])
        if name == pattern or (alias.get("pattern") and fnmatch.fnmatchcase(name, pattern)):
            return pattern
    return None


def claude_code(card: dict[str, Any], url: str, settings: CatalogSettings) -> tuple[str, str]:
    model = card["id"]
    covering = _alias_covering(card, CLAUDE_MODEL_EXAMPLE)
    aliases = (f"this mesh serves them under --model-alias {covering!r}" if covering else
               f"start the mesh with --model-alias 'claude-*={model}' so they resolve too")
    lines = [
        "# Claude Code: export these, then run `claude`",
        f"export ANTHROPIC_BASE_URL={url}",
        f"export ANTHROPIC_API_KEY=${API_KEY_ENV}",
        *(f"export {name}={model}" for name in CLAUDE_CODE_MODEL_VARIABLES),
        "export CLAUDE_CODE_SUBAGENT_MODEL_FORCE=1",
        f"export CLAUDE_CODE_MAX_OUTPUT_TOKENS={card.get('max_output_tokens') or 8192}",
        "export CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
        "# CLAUDE_CODE_SUBAGENT_MODEL_FORCE=1: the sub-agent model above also replaces the one a sub-agent's",
        "# definition names (model: ...) or its Agent call asks for (without it, Claude Code sends those as they",
        f"# are). Names set elsewhere (settings, /model; e.g. {CLAUDE_MODEL_EXAMPLE}) still reach the mesh",
        f"# as they are: {aliases}.",
    ]
    text = "\n".join(lines)
    return text, text


def _pi_model(card: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": card["id"],
        "name": card.get("display_name") or card["id"],
        "reasoning": bool((card.get("reasoning") or {}).get("supported_levels")),
        "input": [m for m in card.get("input_modalities") or ["text"] if m in ("text", "image")],
        "contextWindow": card.get("context_window") or card.get("max_model_len"),
        "maxTokens": card.get("max_output_tokens"),
        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
    }


# pi's and OpenClaw's provider per API the mesh serves: (provider name, their `api`, base URL suffix). The
# Anthropic SDK they use appends /v1/messages itself; the OpenAI one appends /chat/completions or /responses.
_PROVIDERS = (
    ("harnessmesh", "openai-completions", "/v1"),
    ("harnessmesh-responses", "openai-responses", "/v1"),
    ("harnessmesh-anthropic", "anthropic-messages", ""),
)


def _providers(card: dict[str, Any], url: str, api_key: str) -> dict[str, Any]:
    return {name: {"baseUrl": url + suffix, "api": api, "apiKey": api_key, "models": [_pi_model(card)]}
            for name, api, suffix in _PROVIDERS}


def pi(card: dict[str, Any], url: str, settings: CatalogSettings) -> tuple[str, str]:
    """``~/.pi/agent/models.json``, whole: stdout is the file (where to put it goes to stderr)."""
    body = json.dumps({"providers": _providers(card, url, API_KEY_ENV)}, indent=2)
    return body, body


def openclaw(card: dict[str, Any], url: str, settings: CatalogSettings) -> tuple[str, str]:
    config = {
        "models": {"mode": "merge", "providers": _providers(card, url, "${" + API_KEY_ENV + "}")},
        "agents": {"defaults": {"model": {"primary": f"harnessmesh/{card['id']}"}}},
    }
    body = json.dumps(config, indent=2)
    return body, body


_RENDERERS: dict[str, Callable[[dict[str, Any], str, CatalogSettings], tuple[str, str]]] = {
    "codex": codex, "claude-code": claude_code, "pi": pi, "openclaw": openclaw,
}


# Where a JSON config goes (printed to stderr: stdout is the file itself, valid JSON for the harness).
_JSON_FILES = {
    "pi": "save as ~/.pi/agent/models.json, then: pi --provider harnessmesh --model {model}",
    "openclaw": "merge into ~/.openclaw/openclaw.json (or save it there)",
}


def run(ns: argparse.Namespace) -> int:
    """Print the harness's config; 0 on success (fetch errors exit with a message)."""
    settings = settings_from_namespace(CatalogSettings, ns)
    url = settings.url.rstrip("/").removesuffix("/v1")
    card = fetch_card(url, settings.model, settings.api_key or os.environ.get(API_KEY_ENV, ""))
    machine, human = _RENDERERS[ns.harness](card, url, settings)
    if ns.harness in _JSON_FILES:
        print("# " + _JSON_FILES[ns.harness].format(model=card["id"]), file=sys.stderr)
    if settings.only == "catalog":
        print(machine)
    elif settings.only == "config" or ns.harness != "codex":
        print(human)
    else:
        print(f"{human}\n\n# {settings.catalog_path}\n{machine}")
    return 0
