"""Responses API request -> canonical ``ChatRequest``; encoder items; the response store (pure, no server)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.apis.responses.convert import ToolTable, chat_request
from gateway.apis.responses.encode import ResponseEncoder
from gateway.apis.responses.models import ResponsesRequest
from gateway.apis.responses.reasoning_codec import decode_reasoning, encode_reasoning
from gateway.apis.responses.store import ResponseStore
from services.api import chat_pb2, common_pb2
from services.common.errors import InvalidRequestError
from tests.gateway.fake_parse import batch, call_args, call_start, dispatch, finish, reasoning, text

PATCH_TOOL = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
              "format": {"type": "grammar", "syntax": "lark", "definition": "start: hunk+"}}
SPAWN = {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}


def convert(body: dict[str, Any], headers: dict[str, str] | None = None,
            history: list[chat_pb2.Message] | None = None) -> Any:
    request = ResponsesRequest.model_validate({"model": "demo", **body})
    return chat_request(request, headers or {}, history or [], model="demo", request_id="resp_1")


def test_string_input_and_instructions() -> None:
    out = convert({"input": "hi", "instructions": "Be brief."})
    assert [(m.role, m.parts[0].text) for m in out.chat.messages] == [("system", "Be brief."), ("user", "hi")]
    assert [m.role for m in out.history] == ["user"]  # instructions are not part of the stored conversation


def test_assistant_side_items_merge_into_one_ordered_turn() -> None:
    items = [
        {"role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
        {"role": "user", "content": "go"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}], "content": None},
        {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": '{"cmd": "ls"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
        {"type": "reasoning", "summary": [], "encrypted_content": encode_reasoning("raw thoughts")},
        {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "ok"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
    ]
    msgs = convert({"input": items, "tools": [PATCH_TOOL]}).chat.messages
    assert [m.role for m in msgs] == ["developer", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    # A turn without a message item has content "" (docs/conversation-mapping.md), never no content.
    assert [p.WhichOneof("kind") for p in msgs[2].parts] == ["reasoning", "tool_call", "text"]
    assert msgs[2].parts[0].reasoning == "plan" and msgs[2].parts[2].text == ""
    assert msgs[3].tool_call_id == "c1" and msgs[3].name == "exec_command" and msgs[3].parts[0].text == "a.txt"
    assert msgs[4].parts[0].reasoning == "raw thoughts"  # our own encrypted_content round-trips the text
    assert json.loads(msgs[4].parts[1].tool_call.arguments_json) == {"input": "*** Begin Patch"}
    assert msgs[5].name == "apply_patch" and msgs[5].parts[0].text == "ok"
    assert msgs[6].parts[0].text == "done"


def test_foreign_encrypted_content_is_opaque() -> None:
    assert decode_reasoning("gAAAAB-openai-blob") is None
    assert decode_reasoning(encode_reasoning("x")) == "x"
    msgs = convert({"input": [{"role": "user", "content": "q"},
                              {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA"}]}).chat.messages
    assert [m.role for m in msgs] == ["user"]  # nothing readable to replay


def test_tools_custom_namespace_and_builtin() -> None:
    tools = [PATCH_TOOL, {"type": "namespace", "name": "multi_agent_v1", "description": "agents", "tools": [SPAWN]},
             {"type": "web_search", "external_web_access": True}, {"type": "tool_search", "execution": "client"}]
    out = convert({"input": "hi", "tools": tools, "tool_choice": {"type": "custom", "name": "apply_patch"}})
    assert [t.name for t in out.chat.tools] == ["apply_patch", "spawn_agent"]
    assert json.loads(out.chat.tools[0].parameters_json)["required"] == ["input"]
    assert "start: hunk+" in out.chat.tools[0].description
    assert out.tools.kind("apply_patch") == "custom" and out.tools.namespace("spawn_agent") == "multi_agent_v1"
    assert out.chat.tool_choice.mode == "named" and out.chat.tool_choice.name == "apply_patch"


def test_additional_tools_item_adds_tools() -> None:
    item = {"type": "additional_tools", "role": "developer", "tools": [SPAWN]}
    out = convert({"input": [item, {"role": "user", "content": "x"}]})
    assert [t.name for t in out.chat.tools] == ["spawn_agent"]


def test_sampling_effort_and_text_format() -> None:
    out = convert({"input": "hi", "max_output_tokens": 50, "temperature": 0.5, "top_p": 0.9,
                   "reasoning": {"effort": "high", "summary": "auto"}, "text": {"format": {"type": "json_object"}}})
    assert out.chat.sampling.max_tokens == 50 and out.chat.sampling.temperature == 0.5
    assert json.loads(out.chat.chat_template_kwargs_json) == {"reasoning_effort": "high"}
    off = convert({"input": "hi", "reasoning": {"effort": "none"}})
    assert json.loads(off.chat.chat_template_kwargs_json) == {"enable_thinking": False}


def test_codex_thread_headers_map_to_session_and_trajectory() -> None:
    top = convert({"input": "hi"}, {"thread-id": "T1", "user-agent": "codex_exec/0.169.0 (Debian)"}).chat.identity
    assert (top.session_id, top.trajectory_id, top.harness) == ("T1", "T1", "codex")
    sub = convert({"input": "hi"}, {"thread-id": "T2", "x-codex-parent-thread-id": "T1"}).chat.identity
    assert (sub.session_id, sub.trajectory_id) == ("T1", "T2")
    explicit = convert({"input": "hi"}, {"thread-id": "T2", "x-session-id": "S"}).chat.identity
    assert (explicit.session_id, explicit.trajectory_id) == ("S", "T2")
    keyed = convert({"input": "hi", "prompt_cache_key": "K"}).chat.identity
    assert keyed.session_id == "K"


@pytest.mark.parametrize(("body", "param"), [
    ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id"),
    ({"input": "hi", "tools": [{"name": "f"}]}, "tools[0].type"),
    ({"input": "hi", "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    ({"input": "hi", "tool_choice": "required"}, "tool_choice"),
    ({"input": []}, "input"),
    ({"input": [{"role": "user", "content": "hi"}, {"type": {"role": "user"}, "call_id": "c1"}]}, "input[1].type"),
    ({"input": [{"type": [], "call_id": "c1", "output": "22"}]}, "input[0].type"),
])
def test_malformed_requests_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        convert(body)
    assert info.value.param == param


def encoder(tools: ToolTable | None = None) -> ResponseEncoder:
    return ResponseEncoder({"id": "resp_1", "object": "response"}, tools or ToolTable())


def test_custom_and_namespaced_calls_become_their_item_types() -> None:
    out = convert({"input": "hi", "tools": [PATCH_TOOL, {"type": "namespace", "name": "ns", "tools": [SPAWN]}]})
    enc = encoder(out.tools)
    events = enc.start()
    events += enc.feed(batch(reasoning("r"), call_start(0, "c1", "apply_patch"),
                             call_args(0, '{"input": "*** Begin'), call_args(0, ' Patch"}'),
                             dispatch(0, "c1", "apply_patch", '{"input": "*** Begin Patch"}'),
                             call_start(1, "c2", "spawn_agent"), dispatch(1, "c2", "spawn_agent", "{}"),
                             text("ok"), finish(common_pb2.FINISH_REASON_TOOL_CALLS)))
    events += enc.close()
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [d["type"] for d in done] == ["reasoning", "custom_tool_call", "function_call", "message"]
    assert done[1]["input"] == "*** Begin Patch" and done[1]["call_id"] == "c1"
    assert done[2]["namespace"] == "ns" and done[2]["name"] == "spawn_agent"
    assert not any(e["type"] == "response.function_call_arguments.delta" and e["output_index"] == 1 for e in events)
    assert [e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta"] == ["*** Begin Patch"]
    kinds = [p.WhichOneof("kind") for p in enc.assistant_message().parts]
    assert kinds == ["reasoning", "tool_call", "tool_call", "text"]
    assert events[-1]["type"] == "response.completed"


async def test_store_bounds_and_ttl() -> None:
    now = [0.0]
    store = ResponseStore(max_entries=2, ttl=10, clock=lambda: now[0])
    msg = chat_pb2.Message(role="user")
    await store.put("a", [msg], {"id": "a"})
    await store.put("b", [msg], {"id": "b"})
    assert await store.get("a") is not None  # touches a: b is now the least recently used
    await store.put("c", [msg], {"id": "c"})
    assert await store.get("b") is None and len(store) == 2
    now[0] = 5
    assert await store.get("c") is not None  # extends c to 15
    now[0] = 12
    assert await store.get("a") is None and await store.get("c") is not None
    assert await store.delete("c") and len(store) == 0
    disabled = ResponseStore(max_entries=0)
    await disabled.put("x", [msg], {})
    assert await disabled.get("x") is None
