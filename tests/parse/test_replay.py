"""A turn the model produced, parsed into ordered segments, replays byte-identically next turn.

That is what keeps an agent's prompt append-only, so every turn's prefix is a cache hit.
"""

from __future__ import annotations

import pytest

from services.parse.conversation import ChatMessage, Conversation, ReasoningPart, TextPart, ToolCallPart
from services.parse.model_format import ModelFormat
from services.parse.parsers.events import Event, ReasoningDelta, TextDelta, ToolCallDispatch
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
