"""Round trip through every shipped template: render an assistant turn with reasoning and tool calls,
parse the rendered assistant text back with that family's parsers, get the same segments.

Templates that do not render reasoning (their policy drops it) round-trip the tool calls alone.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from services.parse.conversation import (
    ChatMessage,
    Conversation,
    Part,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolSpec,
    to_template_input,
)
from services.parse.parsers.events import Event, ReasoningDelta, TextDelta, ToolCallDispatch
from services.parse.parsers.reasoning import REASONING_FORMATS
from services.parse.parsers.registry import REASONING_PARSERS, TOOL_PARSERS
from services.parse.parsers.tool_core import ParserContext
from services.parse.renderer import ChatTemplateRenderer
from services.parse.replay import template_reads_reasoning
from tests.parse.support import FIXED_NOW, TEMPLATE_FIXTURES, run_parsers

# template family -> (reasoning parser or "", tool parser)
PARSERS = {
    "qwen3": ("qwen3", "hermes"),
    "qwen3-coder": ("", "qwen3_coder"),
    "deepseek-r1": ("deepseek_r1", "deepseek_v3"),
    "deepseek-v3.1": ("deepseek_v3_1", "deepseek_v3_1"),
    "nemotron-nano-v2": ("nemotron_nano", "nemotron_deci"),
    "nemotron-3-nano": ("nemotron3", "qwen3_coder"),
    "gpt-oss": ("gpt_oss", "harmony"),
    "kimi-k2-instruct": ("", "kimi_k2"),
    "glm-4.6": ("glm45", "glm45"),
    "minimax-m2": ("minimax_m2", "minimax_m2"),
    "llama-3.1": ("", "llama3_json"),
    "llama-3.2": ("", "llama3_json"),
    "mistral-small-3.2": ("", "mistral"),
    "llama-nemotron-super-v1.5": ("nemotron_deci", "nemotron_deci"),
}
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "</s>", "[e~[", "<｜end▁of▁sentence｜>")  # noqa: RUF001
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}}}
TOOLS = (ToolSpec("Bash", "Run a command.", json.dumps(SCHEMA)),)
USER = ChatMessage("user", (TextPart("How many Python files are in src/?"),))
TURN: tuple[Part, ...] = (
    ReasoningPart("I should count them with find."),
    TextPart(""),
    ToolCallPart("call12345", "Bash", '{"command": "find src -name \'*.py\' | wc -l", "timeout": 30}'),
)


def _renderer(family: str) -> ChatTemplateRenderer:
    folder = TEMPLATE_FIXTURES / family
    special = json.loads((folder / "special_tokens.json").read_text(encoding="utf-8"))
    named = {k: v for k, v in special.items() if k.endswith("_token") and isinstance(v, str)}
    return ChatTemplateRenderer((folder / "chat_template.jinja").read_text(encoding="utf-8"), named,
                                now=lambda: FIXED_NOW)


def _render(renderer: ChatTemplateRenderer, messages: tuple[ChatMessage, ...], generation_prompt: bool) -> str:
    conversation = Conversation(messages, TOOLS, add_generation_prompt=generation_prompt)
    return renderer.render(to_template_input(conversation, arguments_as_text=renderer.arguments_as_text))


def _parse(reasoning_name: str, tool_name: str, prompt: str, text: str) -> list[Event]:
    ids = (f"call_{i}" for i in itertools.count())
    ctx = ParserContext(prompt, lambda: next(ids), {"Bash": SCHEMA})
    reasoning = REASONING_PARSERS[reasoning_name](ctx) if reasoning_name else None
    return run_parsers(reasoning, TOOL_PARSERS[tool_name](ctx), text)


def _segments(events: list[Event]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for e in events:
        if isinstance(e, ReasoningDelta | TextDelta):
            kind = "reasoning" if isinstance(e, ReasoningDelta) else "text"
            if out and out[-1][0] == kind:
                out[-1] = (kind, out[-1][1] + e.text)
            else:
                out.append((kind, e.text))
        elif isinstance(e, ToolCallDispatch):
            out.append(("tool_call", (e.name, json.loads(e.arguments_json))))
    return [s for s in out if s[0] == "tool_call" or s[1]]


def _cases() -> list[Any]:
    if not TEMPLATE_FIXTURES.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"{TEMPLATE_FIXTURES} is absent"))]
    return [pytest.param(f, id=f) for f in sorted(PARSERS)]


@pytest.mark.parametrize("family", _cases())
def test_rendered_assistant_turn_parses_back_to_the_same_segments(family: str) -> None:
    renderer = _renderer(family)
    prompt = _render(renderer, (USER,), True)
    full = _render(renderer, (USER, ChatMessage("assistant", TURN)), False)
    common = prompt[: next((i for i, (a, b) in enumerate(zip(prompt, full, strict=False)) if a != b),
                           min(len(prompt), len(full)))]
    if common.rfind("<") > common.rfind(">"):
        common = common[: common.rfind("<")]  # never split a marker between prompt and turn
    assistant = full[len(common):]
    special = json.loads((TEMPLATE_FIXTURES / family / "special_tokens.json").read_text(encoding="utf-8"))
    ends = (*END_OF_TURN, special.get("eos_token") or END_OF_TURN[0])
    cut = min((i for i in (assistant.find(m) for m in ends) if i >= 0), default=len(assistant))
    reasoning_name, tool_name = PARSERS[family]
    fmt = REASONING_FORMATS.get(reasoning_name)
    if fmt is not None and fmt.forced and not any(e in assistant for e in fmt.ends):
        common += fmt.starts[0] + fmt.ends[0]  # a forced family's turn without a block had thinking off
    events = _parse(reasoning_name, tool_name, common, assistant[:cut])
    expected: list[tuple[str, Any]] = [("tool_call", ("Bash", {"command": "find src -name '*.py' | wc -l",
                                                                 "timeout": 30}))]
    if reasoning_name and template_reads_reasoning(renderer.template):
        expected.insert(0, ("reasoning", "I should count them with find."))
    assert _segments(events) == expected, assistant
