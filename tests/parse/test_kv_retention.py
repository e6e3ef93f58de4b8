"""The KV retention a chat turn asks of its worker (services/parse/retention.py)."""

from __future__ import annotations

from services.api import chat_pb2, common_pb2
from services.parse.retention import TOOL_WAIT_S, kv_retention


def test_a_conversation_with_tools_asks_for_the_tool_wait_if_the_turn_ends_in_a_call() -> None:
    request = chat_pb2.ChatRequest(tools=[chat_pb2.Tool(name="bash")])
    assert kv_retention(request).tool_call_hold_s == TOOL_WAIT_S
    assert kv_retention(request).hold_s == 0.0 and not kv_retention(request).evict_first
    request.hints.priority = 1
    assert kv_retention(request).tool_call_hold_s == 2 * TOOL_WAIT_S


def test_a_conversation_without_tools_asks_for_nothing() -> None:
    assert kv_retention(chat_pb2.ChatRequest()).ListFields() == []


def test_the_tool_wait_is_the_learnt_one_when_given() -> None:
    request = chat_pb2.ChatRequest(tools=[chat_pb2.Tool(name="bash")])
    assert kv_retention(request, 12.5).tool_call_hold_s == 12.5


def test_a_sub_agents_turn_asks_for_its_blocks_to_go_first_if_it_answers() -> None:
    for identity in (common_pb2.Identity(session_id="s", trajectory_id="a1", parent_trajectory_id="s"),
                     common_pb2.Identity(session_id="child", parent_session_id="s")):
        sub = chat_pb2.ChatRequest(tools=[chat_pb2.Tool(name="bash")], identity=identity)
        hint = kv_retention(sub)
        assert hint.answer_evict_first and hint.tool_call_hold_s == TOOL_WAIT_S and not hint.evict_first
        assert kv_retention(chat_pb2.ChatRequest(identity=identity)).answer_evict_first  # no tools: it answers
    main = chat_pb2.ChatRequest(tools=[chat_pb2.Tool(name="bash")],
                                identity=common_pb2.Identity(session_id="s", trajectory_id="s"))
    assert not kv_retention(main).answer_evict_first


def test_a_request_that_closes_its_session_has_its_blocks_go_first_whatever_its_end() -> None:
    request = chat_pb2.ChatRequest(tools=[chat_pb2.Tool(name="bash")],
                                   hints=common_pb2.AgentHints(session_final=True, cache_ttl_s=300.0))
    hint = kv_retention(request)
    assert hint.evict_first and hint.tool_call_hold_s == 0.0 and not hint.answer_evict_first
