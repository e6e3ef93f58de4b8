"""Helpers shared by the parse tests."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from services.parse.conversation import (
    ChatMessage,
    Conversation,
    Part,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolSpec,
)
from services.parse.parsers.base import OutputParser
from services.parse.parsers.events import Event, TextDelta, merge_deltas

REPO = Path(__file__).resolve().parents[2]
# Real Hugging Face chat templates, conversations and transformers references (provenance in its SOURCES.md).
TEMPLATE_FIXTURES = REPO / "tests" / "fixtures" / "chat_templates"
FIXED_NOW = datetime(2026, 1, 15, 9, 30, 0)


def conversation_from_openai(conv: dict[str, Any], kwargs: dict[str, Any] | None = None) -> Conversation:
    """An OpenAI/HF-style conversation (as in conversations.json) as the canonical domain conversation."""
    messages = []
    for m in conv["messages"]:
        parts: list[Part] = []
        if m.get("reasoning_content") is not None:
            parts.append(ReasoningPart(m["reasoning_content"]))
        if m.get("content") is not None:
            parts.append(TextPart(m["content"]))
        for call in m.get("tool_calls") or []:
            fn = call.get("function", call)
            args = fn["arguments"]
            text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            parts.append(ToolCallPart(call.get("id", ""), fn["name"], text))
        messages.append(
            ChatMessage(m["role"], tuple(parts), tool_call_id=m.get("tool_call_id", ""), name=m.get("name", ""))
        )
    tools = tuple(
        ToolSpec(t["function"]["name"], t["function"].get("description", ""), json.dumps(t["function"]["parameters"]))
        for t in conv.get("tools") or []
    )
    return Conversation(
        messages=tuple(messages),
        tools=tools,
        template_kwargs_json=json.dumps(kwargs or {}),
        add_generation_prompt=conv.get("add_generation_prompt", True),
    )


def run_parsers(reasoning: OutputParser | None, tools: OutputParser, pieces: Iterable[str]) -> list[Event]:
    """Feed text ``pieces`` through a reasoning parser (if any) then the tool parser, as the pipeline does."""
    events: list[Event] = []

    def route(evs: list[Event]) -> None:
        for e in evs:
            events.extend(tools.feed(e.text) if isinstance(e, TextDelta) else [e])

    for piece in pieces:
        route(reasoning.feed(piece) if reasoning else [TextDelta(piece)])
    route(reasoning.finish() if reasoning else [])
    events += tools.finish()
    return merge_deltas(events)
