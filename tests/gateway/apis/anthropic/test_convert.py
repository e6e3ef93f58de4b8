"""Anthropic Messages request -> canonical ChatRequest."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.apis.anthropic.convert import chat_request, strip_preamble
from gateway.apis.anthropic.encode import tool_use_id
from gateway.apis.anthropic.models import MessagesRequest
from services.api import chat_pb2
from services.common.errors import InvalidRequestError

BASH = {"name": "Bash", "description": "Run a command", "input_schema": {"type": "object", "properties": {
    "command": {"type": "string"}}, "required": ["command"]}}


def convert(body: dict[str, Any], headers: dict[str, str] | None = None, strip: bool = True) -> chat_pb2.ChatRequest:
    full = {"model": "demo", "max_tokens": 100, **body}
    return chat_request(MessagesRequest.model_validate(full), headers or {}, model="demo", request_id="r",
                        strip=strip)


def parts(message: chat_pb2.Message) -> list[tuple[str, str]]:
    out = []
    for p in message.parts:
        kind = p.WhichOneof("kind")
        out.append((kind, p.tool_call.name + p.tool_call.arguments_json if kind == "tool_call" else getattr(p, kind)))
    return out


def test_claude_code_shape() -> None:
    chat = convert({
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cc_entrypoint=cli;"},
                   {"type": "text", "text": "You are Claude.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<reminder>"}, {"type": "text", "text": "run ls"}]},
            {"role": "system", "content": "# Environment"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "I should run ls", "signature": ""},
                {"type": "text", "text": "Running."},
                {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
                {"type": "redacted_thinking", "data": "opaque"}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "a.txt", "is_error": False,
                 "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "now explain"}]},
        ],
        "tools": [BASH, {"name": "DeferredToolPlaceholder", "defer_loading": True, "input_schema": {"type": "object"}},
                  {"type": "web_search_20250305", "name": "web_search"}],
        "thinking": {"type": "adaptive", "display": "updates"},
        "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "metadata": {"user_id": json.dumps({"device_id": "d", "session_id": "s-123"})},
        "unknown_field": {"ignored": True},
    })
    assert [m.role for m in chat.messages] == ["system", "user", "system", "assistant", "tool", "user"]
    assert parts(chat.messages[0]) == [("text", "x-anthropic-billing-header: cc_version=1; cc_entrypoint=cli;"),
                                       ("text", "You are Claude.")]
    assert parts(chat.messages[3]) == [("reasoning", "I should run ls"), ("text", "Running."),
                                       ("tool_call", 'Bash{"command": "ls"}')]
    tool = chat.messages[4]
    assert (tool.tool_call_id, tool.name, tool.is_error, parts(tool)) == ("t1", "Bash", False, [("text", "a.txt")])
    assert [t.name for t in chat.tools] == ["Bash"]
    assert json.loads(chat.chat_template_kwargs_json) == {"reasoning_effort": "high",
                                                          "truncate_history_thinking": False}
    assert chat.identity.session_id == "s-123"
    assert chat.HasField("strip_billing_header") and chat.strip_billing_header
    assert chat.add_generation_prompt and not chat.continue_final_message


def test_string_and_block_content_convert_the_same() -> None:
    a = convert({"messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "env"}]})
    b = convert({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                              {"role": "system", "content": [{"type": "text", "text": "env"}]}]})
    assert a.messages == b.messages


def test_sampling_thinking_and_tool_choice() -> None:
    chat = convert({"messages": [{"role": "user", "content": "hi"}], "tools": [BASH],
                    "tool_choice": {"type": "tool", "name": "Bash"}, "stop_sequences": ["END"],
                    "temperature": 0.5, "top_p": 0.9, "top_k": 20,
                    "thinking": {"type": "enabled", "budget_tokens": 2048}})
    assert chat.tool_choice.mode == "named" and chat.tool_choice.name == "Bash"
    assert chat.sampling.max_tokens == 100 and list(chat.sampling.stop) == ["END"]
    assert chat.sampling.temperature == 0.5 and chat.sampling.top_k == 20
    assert json.loads(chat.chat_template_kwargs_json) == {"enable_thinking": True, "thinking_budget": 2048}
    assert convert({"messages": [{"role": "user", "content": "hi"}], "tools": [BASH],
                    "tool_choice": {"type": "any"}}).tool_choice.mode == "required"
    assert convert({"messages": [{"role": "user", "content": "hi"}],
                    "tool_choice": {"type": "none"}}).tool_choice.mode == "none"
    disabled = convert({"messages": [{"role": "user", "content": "hi"}], "thinking": {"type": "disabled"}})
    assert json.loads(disabled.chat_template_kwargs_json) == {"enable_thinking": False}


def test_clear_thinking_keeps_only_the_latest_turns() -> None:
    turn = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}, {"type": "text", "text": "a"}]}]
    chat = convert({"messages": [*turn, *turn, *turn, {"role": "user", "content": "q"}],
                    "context_management": {"edits": [{"type": "clear_thinking_20251015",
                                                      "keep": {"type": "thinking_turns", "value": 2}}]}})
    kinds = [[p.WhichOneof("kind") for p in m.parts] for m in chat.messages if m.role == "assistant"]
    assert kinds == [["text"], ["reasoning", "text"], ["reasoning", "text"]]


def test_final_assistant_message_is_a_prefill() -> None:
    chat = convert({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure,"}]})
    assert chat.continue_final_message and not chat.add_generation_prompt


@pytest.mark.parametrize("content", [
    [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}],
    [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}],
])
def test_images_are_a_clear_400(content: list[dict[str, Any]]) -> None:
    with pytest.raises(InvalidRequestError, match="does not accept images") as info:
        convert({"messages": [{"role": "user", "content": content}]})
    assert info.value.param.startswith("messages.0.content.0")


def test_bad_tool_choice_names_the_field() -> None:
    with pytest.raises(InvalidRequestError) as info:
        convert({"messages": [{"role": "user", "content": "hi"}], "tools": [BASH],
                 "tool_choice": {"type": "tool", "name": "Nope"}})
    assert info.value.param == "tool_choice.name"


def test_strip_default_and_header_override() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert not convert(body, strip=False).strip_billing_header
    assert strip_preamble({}, True) and not strip_preamble({}, False)
    assert not strip_preamble({"x-harnessmesh-strip-anthropic-preamble": "0"}, True)
    assert strip_preamble({"x-harnessmesh-strip-anthropic-preamble": "true"}, False)


def test_toolu_ids_we_handed_out_round_trip_to_the_mesh_call_id() -> None:
    """The encoder renames ``call_X`` to ``toolu_X``; what the client sends back is ``call_X`` again, for the
    assistant's tool_use and its tool_result alike, so the prompt pairs them and matches the other APIs'."""
    sent = tool_use_id("call_4f2a9c")
    chat = convert({"messages": [
        {"role": "user", "content": "run ls"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": sent, "name": "Bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": sent, "content": "a.txt"},
                                     {"type": "tool_result", "tool_use_id": "own_id", "content": "x"}]},
    ]})
    assistant, result, other = chat.messages[1], chat.messages[2], chat.messages[3]
    assert sent.startswith("toolu_") and assistant.parts[0].tool_call.id == "call_4f2a9c"
    assert (result.role, result.tool_call_id, result.name) == ("tool", "call_4f2a9c", "Bash")
    assert other.tool_call_id == "own_id"  # a client's own ids are kept
