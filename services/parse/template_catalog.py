"""The template policy of the served model: flags (``--inline-system``, ``--tool-prompt-template``,
``--unrendered-tools``) overridden per model by the model catalog's keys of the same names.

The catalog is the gateway's ``--model-catalog`` file (``gateway/catalog.py``); ``harnessmesh up`` gives both
services the same file. The parse service reads only these keys, from the ``*`` entry and then the served
model's own entry (the later wins), and checks their values; the gateway checks the rest. Light to import: the
settings module uses the choices.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

INLINE_SYSTEM_CHOICES = ("auto", "as-is", "user")
UNRENDERED_TOOLS_CHOICES = ("warn", "refuse")
CATALOG_KEYS = ("inline_system", "tool_prompt_template", "unrendered_tools")


@dataclass(frozen=True)
class TemplatePolicy:
    """What the operator asked for; ``*_source`` says where each value came from (a flag or a catalog entry)."""

    inline_system: str = "auto"
    tool_prompt_template: str = ""
    unrendered_tools: str = "warn"
    inline_system_source: str = "--inline-system"


def _read(path: str) -> Any:
    import yaml  # only when a catalog is given

    try:
        text = Path(path).read_text(encoding="utf-8")
        return json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read model catalog {path!r}: {exc}") from exc


def _check(entry: dict[str, Any], where: str) -> None:
    for key, choices in (("inline_system", INLINE_SYSTEM_CHOICES), ("unrendered_tools", UNRENDERED_TOOLS_CHOICES)):
        if key in entry and entry[key] not in choices:
            raise ValueError(f"{where}.{key} must be one of {', '.join(choices)}, not {entry[key]!r}")
    if "tool_prompt_template" in entry and not isinstance(entry["tool_prompt_template"], str):
        raise ValueError(f"{where}.tool_prompt_template must be a string (a built-in name or a file)")


def template_policy(base: TemplatePolicy, catalog: str, served_model_name: str) -> TemplatePolicy:
    """``base`` (the flags) overridden by ``catalog``'s ``*`` entry, then by ``served_model_name``'s."""
    if not catalog:
        return base
    data = _read(catalog)
    models = data.get("models") if isinstance(data, dict) else None
    if data is not None and not isinstance(models, dict):
        raise ValueError(f"{catalog}: expected a mapping with a 'models' mapping of model name -> fields")
    policy = base
    for name in ("*", served_model_name):
        entry = (models or {}).get(name)
        if not isinstance(entry, dict):
            continue
        _check(entry, f"{catalog}: models.{name}")
        found = {key: entry[key] for key in CATALOG_KEYS if key in entry}
        if "inline_system" in found:
            found["inline_system_source"] = f"the model catalog (models.{name}.inline_system)"
        policy = replace(policy, **found)
    return policy
