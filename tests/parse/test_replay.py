"""A turn the model produced, parsed into ordered segments, replays byte-identically next turn.

That is what keeps an agent's prompt append-only, so every turn's prefix is a cache hit.
"""

from __future__ import annotations

from datetime import datetime

import pytest

from services.parse.conversation import (
    ChatMessage,
    Conversation,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    to_template_input,
)
from services.parse.model_format import ModelFormat
from services.parse.parsers.events import Event, ReasoningDelta, TextDelta, ToolCallDispatch
from services.parse.replay import ReplayPolicy
from services.parse.settings import ParseSettings
from tests.parse.test_parsers import DEMO, pipeline

COMPLETIONS = {
    "think_tool_think_tool": (
        "<think>\nParis first.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        "<think>\nNow Lyon.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>'
    ),
    "text_then_parallel_calls": (
        "<think>\nTwo cities.\n</think>\n\nChecking both.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon", "unit": "c"}}\n</tool_call>'
    ),
    "final_answer": "<think>\nBoth are mild.\n</think>\n\nParis is 18C and Lyon is 20C.",
}


def parts_from(events: list[Event]) -> tuple[ReasoningPart | TextPart | ToolCallPart, ...]:
    """What a harness sends back: the segments in the order the events arrived."""
    parts: list[ReasoningPart | TextPart | ToolCallPart] = []
    for event in events:
        if isinstance(event, ReasoningDelta):
            if parts and isinstance(parts[-1], ReasoningPart):
                parts[-1] = ReasoningPart(parts[-1].text + event.text)
            else:
                parts.append(ReasoningPart(event.text))
        elif isinstance(event, TextDelta):
            if parts and isinstance(parts[-1], TextPart):
                parts[-1] = TextPart(parts[-1].text + event.text)
            else:
                parts.append(TextPart(event.text))
        elif isinstance(event, ToolCallDispatch):
            parts.append(ToolCallPart(event.id, event.name, event.arguments_json))
    return tuple(parts)


@pytest.mark.parametrize("name", sorted(COMPLETIONS))
def test_parsed_turn_replays_byte_identically(name: str) -> None:
    completion = COMPLETIONS[name]
    fmt = ModelFormat(DEMO)
    user = ChatMessage("user", (TextPart("Weather in Paris and Lyon?"),))
    prompt = fmt.render(Conversation(messages=(user,)))
    ids = [*DEMO.tokenizer.encode(completion, add_special_tokens=False).ids, DEMO.eos_token_ids[0]]
    p = pipeline(prompt)
    events = [e for i in range(len(ids)) for e in p.feed(ids[i:i + 1])] + p.finish()
    assistant = ChatMessage("assistant", parts_from(events))
    follow_up = ChatMessage("user", (TextPart("thanks"),))
    replayed = fmt.render(Conversation(messages=(user, assistant, follow_up)))
    assert replayed.startswith(prompt + completion + "<|im_end|>\n")


# -- the replay policy -------------------------------------------------------------------------------

TURN = ChatMessage("assistant", (ReasoningPart("plan"), ToolCallPart("c1", "f", '{"a": 1}'), ReasoningPart("again"),
                                 TextPart("done")))
USER = ChatMessage("user", (TextPart("go"),))


def test_auto_policy_passes_reasoning_only_to_templates_that_read_it() -> None:
    assert ReplayPolicy.for_template("{{ m.reasoning_content }}").mode == "pass"
    assert ReplayPolicy.for_template("{{ message.thinking }}").mode == "pass"
    assert ReplayPolicy.for_template("{{ message.content }}").mode == "drop"
    assert ReplayPolicy.for_template("{{ message.content }}", "reinsert").mode == "reinsert"
    with pytest.raises(ValueError, match="valid: auto, pass, reinsert, drop"):
        ReplayPolicy.for_template("", "sometimes")


def test_reinsert_puts_reasoning_back_in_the_models_markers_in_place() -> None:
    policy = ReplayPolicy(mode="reinsert", open="<think>\n", close="\n</think>\n\n", keep_history=True)
    data = to_template_input(Conversation((USER, TURN, USER)), replay=policy)
    assistant = data.messages[1]
    assert assistant["content"] == "<think>\nplan\n</think>\n\n<think>\nagain\n</think>\n\ndone"
    assert "reasoning_content" not in assistant
    assert [s["type"] for s in assistant["segments"]] == ["text", "tool_call", "text", "text"]
    assert data.kwargs == {"truncate_history_thinking": False}


def test_truncate_history_thinking_per_request() -> None:
    policy = ReplayPolicy(mode="reinsert", keep_history=True)
    kwargs = '{"truncate_history_thinking": true}'
    data = to_template_input(Conversation((USER, TURN, USER), template_kwargs_json=kwargs), replay=policy)
    assert data.messages[1]["content"] == "done"  # earlier turn: reasoning dropped on request
    assert data.kwargs == {"truncate_history_thinking": True}
    dropped = to_template_input(Conversation((USER, TURN, USER)), replay=ReplayPolicy(mode="drop"))
    assert "reasoning_content" not in dropped.messages[1] and dropped.messages[1]["content"] == "done"
    assert dropped.kwargs == {}


def test_with_a_reasoning_parser_history_is_kept_by_default() -> None:
    assert ModelFormat(DEMO, reasoning_parser="qwen3").replay.keep_history
    assert not ModelFormat(DEMO).replay.keep_history


def test_template_now_pins_the_clock() -> None:
    settings = ParseSettings(template_now="2026-01-15T09:30:00")
    assert settings.template_clock() == datetime(2026, 1, 15, 9, 30)
    assert ParseSettings().template_clock() is None
    with pytest.raises(ValueError, match="not an ISO time"):
        ParseSettings(template_now="tomorrow").validate()
