"""The KV retention a chat turn asks of its worker (services/parse/retention.py)."""

from __future__ import annotations

from services.api import chat_pb2
from services.parse.retention import TOOL_WAIT_S, kv_retention


def test_a_conversation_with_tools_asks_for_the_tool_wait_if_the_turn_ends_in_a_call() -> None:
    request = chat_pb2.ChatRequest(tools=[chat_pb2.Tool(name="bash")])
    assert kv_retention(request).tool_call_hold_s == TOOL_WAIT_S
    assert kv_retention(request).hold_s == 0.0 and not kv_retention(request).evict_first
    request.hints.priority = 1
    assert kv_retention(request).tool_call_hold_s == 2 * TOOL_WAIT_S


def test_a_conversation_without_tools_asks_for_nothing() -> None:
    assert kv_retention(chat_pb2.ChatRequest()).ListFields() == []
