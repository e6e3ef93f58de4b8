"""The model catalog: per-model metadata that makes harnesses behave as with a native model.

Harnesses size their context management, tool-output truncation and reasoning controls from
model metadata; without it they fall back to generic behaviour. Every served model gets a
``ModelProfile``: defaults derived from what the parse service reports (``max_model_len`` and
``input_modalities`` from the model's ``config.json``, the reasoning and tool parsers), overridden
per model by the ``--model-catalog`` file (YAML or JSON)::

    models:
      demo:                       # the served model name; "*" applies to every model
        context_window: 32768
        max_output_tokens: 8192
        reasoning_levels: [low, medium, high]
        default_reasoning_level: medium
        default_reasoning_summary: auto
        truncation_policy: {mode: tokens, limit: 10000}
        parallel_tool_calls: true
        input_modalities: [text]
        display_name: Demo
        description: local demo model
        base_instructions: "You are a coding agent..."   # Codex's base prompt for this model
        inline_system: auto       # read by the parse service (services/parse/template_catalog.py):
        tool_prompt_template: ""  #   how the chat template gets inline system messages and tools
        unrendered_tools: warn
        compaction_instruction: "Summarize ..."           # how the model is asked to compact (see below)

``compaction_instruction`` is the user message the Responses API appends after a conversation to have the
model write its compaction summary (an input ending in ``compaction_trigger``, ``POST /v1/responses/compact``;
docs/conversation-mapping.md, "Compaction"). The default is ``DEFAULT_COMPACTION_INSTRUCTION``.

Unknown keys are an error (a typo would otherwise be silently ignored).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from services.api import chat_pb2

REASONING_LEVELS = ("low", "medium", "high")
SUMMARY_MODES = ("auto", "concise", "detailed", "none")
TRUNCATION_MODES = ("tokens", "bytes")
DEFAULT_BASE_INSTRUCTIONS = (
    "You are a coding agent running in a terminal-based harness. Use the available tools to inspect and "
    "change the workspace; run shell commands with the shell tool, then answer concisely."
)

DEFAULT_COMPACTION_INSTRUCTION = (
    "Context checkpoint: the conversation above is about to be replaced by a summary, which you write now. "
    "Do not call any tool. Write a handoff summary for whoever resumes this work (another model, or you "
    "without this history): the user's goal and constraints, what has been done and decided (commands run, "
    "files changed, results that matter, with exact names, paths and values), what failed and why, and the "
    "next steps. Write only the summary, as concise plain text."
)


class CatalogError(ValueError):
    """The catalog file cannot be read or holds an invalid entry (the message names file and field)."""


@dataclass(frozen=True)
class ModelProfile:
    """What harnesses need to know about one served model."""

    context_window: int
    max_output_tokens: int
    reasoning_levels: tuple[str, ...] = REASONING_LEVELS
    default_reasoning_level: str | None = "medium"
    default_reasoning_summary: str = "auto"
    truncation_policy: dict[str, Any] = field(default_factory=lambda: {"mode": "tokens", "limit": 10000})
    parallel_tool_calls: bool = True
    input_modalities: tuple[str, ...] = ("text",)
    reasoning_parser: str = ""
    tool_parser: str = ""
    display_name: str = ""
    description: str = "served by harnessmesh"
    base_instructions: str = DEFAULT_BASE_INSTRUCTIONS
    compaction_instruction: str = DEFAULT_COMPACTION_INSTRUCTION

    def metadata(self) -> dict[str, Any]:
        """The fields ``GET /v1/models`` adds to each model card."""
        return {
            "context_window": self.context_window,
            "max_output_tokens": self.max_output_tokens,
            "reasoning": {
                "supported_levels": list(self.reasoning_levels),
                "default_level": self.default_reasoning_level,
                "default_summary": self.default_reasoning_summary,
            },
            "truncation_policy": dict(self.truncation_policy),
            "supports_parallel_tool_calls": self.parallel_tool_calls,
            "input_modalities": list(self.input_modalities),
            "parsers": {"reasoning": self.reasoning_parser or None, "tool": self.tool_parser or None},
            "display_name": self.display_name,
            "description": self.description,
            "base_instructions": self.base_instructions,
        }


def default_profile(info: chat_pb2.ModelInfo, public_name: str = "") -> ModelProfile:
    """Sensible defaults from the parse service's view of the model (its config.json and parsers)."""
    context = info.max_model_len or 32768
    reasons = bool(info.reasoning_parser)
    return ModelProfile(
        context_window=context,
        max_output_tokens=max(1, min(context // 4, 32768)),
        reasoning_levels=REASONING_LEVELS if reasons else (),
        default_reasoning_level="medium" if reasons else None,
        default_reasoning_summary="auto" if reasons else "none",
        parallel_tool_calls=bool(info.tool_parser),
        input_modalities=tuple(info.input_modalities) or ("text",),
        reasoning_parser=info.reasoning_parser,
        tool_parser=info.tool_parser,
        display_name=public_name or info.served_model_name,
    )


_FIELDS = {f.name for f in dataclasses.fields(ModelProfile)} - {"reasoning_parser", "tool_parser"}
# Keys the parse service reads from the same file (services/parse/template_catalog.py checks their values); the
# gateway accepts them and shows their effect from the parse service's ModelInfo (``chat_template`` of a card).
PARSE_KEYS = frozenset({"inline_system", "tool_prompt_template", "unrendered_tools"})


def _check_entry(name: str, entry: Any, where: str) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise CatalogError(f"{where}: models.{name} must be a mapping")
    unknown = set(entry) - _FIELDS - PARSE_KEYS
    if unknown:
        raise CatalogError(f"{where}: models.{name} has unknown keys {sorted(unknown)}; "
                           f"valid: {sorted(_FIELDS | PARSE_KEYS)}")
    for key in ("context_window", "max_output_tokens"):
        if key in entry and (not isinstance(entry[key], int) or entry[key] < 1):
            raise CatalogError(f"{where}: models.{name}.{key} must be a positive integer")
    instruction = entry.get("compaction_instruction")
    if instruction is not None and (not isinstance(instruction, str) or not instruction.strip()):
        raise CatalogError(f"{where}: models.{name}.compaction_instruction must be a non-empty string")
    levels = entry.get("reasoning_levels")
    if levels is not None and (not isinstance(levels, list) or not all(isinstance(x, str) for x in levels)):
        raise CatalogError(f"{where}: models.{name}.reasoning_levels must be a list of strings")
    summary = entry.get("default_reasoning_summary")
    if summary is not None and summary not in SUMMARY_MODES:
        raise CatalogError(f"{where}: models.{name}.default_reasoning_summary must be one of {SUMMARY_MODES}")
    policy = entry.get("truncation_policy")
    if policy is not None and (
        not isinstance(policy, dict) or policy.get("mode") not in TRUNCATION_MODES
        or not isinstance(policy.get("limit"), int) or policy["limit"] < 1
    ):
        raise CatalogError(f"{where}: models.{name}.truncation_policy must be "
                           "{mode: tokens|bytes, limit: positive integer}")
    out = {key: value for key, value in entry.items() if key not in PARSE_KEYS}
    for key in ("reasoning_levels", "input_modalities"):
        if key in out:
            out[key] = tuple(out[key])
    return out


@dataclass(frozen=True)
class ModelCatalog:
    """Per-model overrides (by served name, ``*`` for all) on top of the derived defaults."""

    entries: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    source: str = ""

    @classmethod
    def load(cls, path: str | Path) -> ModelCatalog:
        """Read a YAML or JSON catalog file (JSON is YAML, so one parser reads both)."""
        where = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
            data = json.loads(text) if where.endswith(".json") else yaml.safe_load(text)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError) as exc:
            raise CatalogError(f"cannot read model catalog {where!r}: {exc}") from exc
        return cls.parse(data, where)

    @classmethod
    def parse(cls, data: Any, where: str = "<catalog>") -> ModelCatalog:
        if data is None:
            return cls(source=where)
        models = data.get("models") if isinstance(data, dict) else None
        if not isinstance(models, dict):
            raise CatalogError(f"{where}: expected a mapping with a 'models' mapping of model name -> fields")
        return cls({str(name): _check_entry(str(name), entry, where) for name, entry in models.items()}, where)

    def profile(self, info: chat_pb2.ModelInfo, public_name: str = "") -> ModelProfile:
        """The profile of the served model: defaults, then ``*``, then its own entry."""
        profile = default_profile(info, public_name)
        for key in ("*", info.served_model_name, public_name):
            if key and key in self.entries:
                profile = dataclasses.replace(profile, **self.entries[key])
        return profile
