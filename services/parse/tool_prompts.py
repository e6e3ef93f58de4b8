# ruff: noqa: RUF001, RUF002 - DeepSeek's markers are spelled with fullwidth bars, on purpose
"""Tool-prompt templates: the request's tools as system-message text, for chat templates that never render tools.

DeepSeek-R1's and DeepSeek-V3.1's chat templates read no ``tools`` variable: the models were trained on a tool
section in the system prompt and call tools in the markers their templates replay. A tool-prompt template is a
small Jinja template that gets ``tools`` (the OpenAI-style tool dicts the chat template would have had) and
returns that section; :meth:`ToolPrompt.into_system` appends it to the leading system message (or makes one).
The same tools give the same text every turn, so the prompt's head stays a cache hit.

Built in (``--tool-prompt-template NAME`` or the catalog's ``tool_prompt_template``), each showing the call format
its chat template replays in history: ``deepseek-v3.1`` (the tool section of DeepSeek-V3.1's model card:
``<｜tool▁call▁begin｜>name<｜tool▁sep｜>{json}``) and ``deepseek-r1`` (``function<｜tool▁sep｜>name`` and a
fenced JSON block, as DeepSeek-R1's template writes calls). Any other value is a path to a Jinja file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

_DEEPSEEK_FORMAT_HINT = """
Where:
- `tool_call_name` must be an exact match to one of the available tools
- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema
- For multiple tool calls, chain them directly without separators or spaces"""

BUILTIN = {
    "deepseek-v3.1": (
        "## Tools\nYou have access to the following tools:\n"
        "{% for tool in tools %}\n### {{ tool.function.name }}\nDescription: {{ tool.function.description }}\n\n"
        "Parameters: {{ tool.function.parameters | tojson }}\n{% endfor %}\n"
        "IMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments"
        "<｜tool▁call▁end｜>{{ '{{additional_tool_calls}}' }}<｜tool▁calls▁end｜>\n" + _DEEPSEEK_FORMAT_HINT
    ),
    "deepseek-r1": (
        "## Tools\nYou have access to the following tools:\n"
        "{% for tool in tools %}\n### {{ tool.function.name }}\nDescription: {{ tool.function.description }}\n\n"
        "Parameters: {{ tool.function.parameters | tojson }}\n{% endfor %}\n"
        "IMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>tool_call_name\n```json\n"
        "tool_call_arguments\n```<｜tool▁call▁end｜>{{ '{{additional_tool_calls}}' }}<｜tool▁calls▁end｜>\n"
        + _DEEPSEEK_FORMAT_HINT
    ),
}

# Chat templates (by a string only they contain) whose families need a built-in tool prompt; the docs list them.
SUGGESTED = {"<｜tool▁sep｜>' + tool['function']['name']": "deepseek-r1",
             "<｜tool▁call▁begin｜>'+ tool['function']['name']": "deepseek-v3.1"}


def suggested_tool_prompt(chat_template: str) -> str:
    """The built-in tool prompt for ``chat_template``'s family, or "" when none is known."""
    return next((name for marker, name in SUGGESTED.items() if marker in chat_template), "")


def _tojson(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


class ToolPrompt:
    """A compiled tool-prompt template; ``name`` is the built-in name or the file it came from."""

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
        env.filters["tojson"] = _tojson
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise ValueError(f"tool-prompt template {name!r} does not compile: {exc}") from exc
        self._last: tuple[list[dict[str, Any]], str] | None = None  # the last tool list and its text

    @classmethod
    def load(cls, name_or_path: str) -> ToolPrompt:
        """A built-in (by name) or a Jinja file (by path)."""
        if name_or_path in BUILTIN:
            return cls(name_or_path, BUILTIN[name_or_path])
        path = Path(name_or_path)
        if not path.is_file():
            raise ValueError(f"tool-prompt template {name_or_path!r} is neither a built-in ({', '.join(BUILTIN)}) "
                             "nor a file")
        return cls(str(path), path.read_text(encoding="utf-8"))

    def text(self, tools: list[dict[str, Any]]) -> str:
        """The tool section for ``tools``; the same list object (a harness's tools every turn) is rendered once."""
        last = self._last
        if last is not None and last[0] is tools:
            return last[1]
        try:
            made = self._template.render(tools=tools).strip()
        except jinja2.TemplateError as exc:
            raise ValueError(f"tool-prompt template {self.name!r} failed: {exc}") from exc
        self._last = (tools, made)
        return made

    def into_system(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` with the tool section after the leading system message's text (or as a new first message)."""
        section = self.text(tools)
        if messages and messages[0]["role"] == "system":
            content = messages[0].get("content") or ""
            joined = content + "\n\n" + section if content else section
            return [{**messages[0], "content": joined}, *messages[1:]]
        return [{"role": "system", "content": section}, *messages]
