"""docs/conversation-mapping.md as test code: an OpenAI-form conversation as each API's request, and the
OpenAI-form conversation that request stands for (what the template must be rendered with).

``request(api, conversation, kwargs)`` writes the request a client of ``api`` sends for the conversation
(None: the kwargs cannot be said in that API); ``equivalent(api, conversation)`` applies the mapping back,
which is where an API cannot express a difference (Anthropic and Responses have no null content; Responses
merges consecutive assistant turns; both name a tool result after its call; an Anthropic conversation
that ends with an assistant message is a prefill). ``RULES`` names the document's
rule ids, each implemented here; a test checks the two lists are the same.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from services.api import chat_pb2

Conversation = dict[str, Any]  # {"messages": [...], "tools": [...]} in the OpenAI form
API_NAMES = ("openai_chat", "anthropic", "responses", "grpc_edge")
RULES = frozenset(
    {
        "chat.content",
        "chat.reasoning",
        "chat.tool_calls",
        "chat.tool",
        "chat.kwargs",
        "anthropic.system",
        "anthropic.user",
        "anthropic.assistant",
        "anthropic.tools",
        "anthropic.kwargs",
        "anthropic.prefill",
        "anthropic.ids",  # the fixtures' ids are not toolu_X: kept as sent (tests/gateway/apis/anthropic)
        "responses.instructions",
        "responses.assistant",
        "responses.tool",
        "responses.tools",
        "responses.kwargs",
        "grpc.messages",
        "grpc.tools",
        "grpc.kwargs",
    }
)


def _arguments(call: dict[str, Any]) -> str:
    """Tool-call arguments as the JSON text clients send (conversations.json holds mappings)."""
    args = call["function"]["arguments"]
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def _functions(conversation: Conversation) -> list[dict[str, Any]]:
    return [t["function"] for t in conversation.get("tools") or []]


def openai_chat(conversation: Conversation, kwargs: dict[str, Any]) -> dict[str, Any]:
    """[chat.*]: the messages as they are, arguments as JSON text, kwargs as ``chat_template_kwargs``."""
    messages = copy.deepcopy(conversation["messages"])
    for m in messages:
        for call in m.get("tool_calls") or []:
            call["function"]["arguments"] = _arguments(call)
    body: dict[str, Any] = {"model": "m", "messages": messages, "chat_template_kwargs": kwargs}
    if conversation.get("tools"):
        body["tools"] = conversation["tools"]
    return body


def _anthropic_kwargs(kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """[anthropic.kwargs]"""
    out: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key == "enable_thinking":
            out["thinking"] = {"type": "enabled" if value else "disabled"}
        elif key == "reasoning_effort":
            out["output_config"] = {"effort": value}
        else:
            return None
    return out


def anthropic(conversation: Conversation, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """[anthropic.system] [anthropic.user] [anthropic.assistant] [anthropic.tools]"""
    extra = _anthropic_kwargs(kwargs)
    if extra is None:
        return None
    messages = list(conversation["messages"])
    body: dict[str, Any] = {"model": "m", "max_tokens": 64, **extra}
    if messages and messages[0]["role"] == "system":
        body["system"] = messages.pop(0)["content"]
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant":
            blocks: list[dict[str, Any]] = []
            if m.get("reasoning_content") is not None:
                blocks.append({"type": "thinking", "thinking": m["reasoning_content"], "signature": ""})
            if m.get("content"):
                blocks.append({"type": "text", "text": m["content"]})
            blocks += [
                {"type": "tool_use", "id": c["id"], "name": c["function"]["name"], "input": json.loads(_arguments(c))}
                for c in m.get("tool_calls") or []
            ]
            out.append({"role": "assistant", "content": blocks})
        elif m["role"] == "tool":
            block = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    body["messages"] = out
    if conversation.get("tools"):
        body["tools"] = [
            {"name": f["name"], "description": f.get("description"), "input_schema": f["parameters"]}
            for f in _functions(conversation)
        ]
    return body


def _responses_kwargs(kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """[responses.kwargs]"""
    if not kwargs:
        return {}
    if kwargs == {"enable_thinking": False}:
        return {"reasoning": {"effort": "none"}}
    if set(kwargs) == {"reasoning_effort"}:
        return {"reasoning": {"effort": kwargs["reasoning_effort"]}}
    return None


def responses(conversation: Conversation, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """[responses.instructions] [responses.assistant] [responses.tool] [responses.tools]"""
    extra = _responses_kwargs(kwargs)
    if extra is None:
        return None
    messages = list(conversation["messages"])
    body: dict[str, Any] = {"model": "m", "store": False, **extra}
    if messages and messages[0]["role"] == "system":
        body["instructions"] = messages.pop(0)["content"]
    items: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant":
            if m.get("reasoning_content") is not None:
                items.append(
                    {
                        "type": "reasoning",
                        "summary": [],
                        "content": [{"type": "reasoning_text", "text": m["reasoning_content"]}],
                    }
                )
            if m.get("content"):
                items.append(
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": m["content"]}]}
                )
            items += [
                {"type": "function_call", "call_id": c["id"], "name": c["function"]["name"], "arguments": _arguments(c)}
                for c in m.get("tool_calls") or []
            ]
        elif m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
        else:
            items.append({"type": "message", "role": m["role"], "content": m["content"]})
    body["input"] = items
    if conversation.get("tools"):
        body["tools"] = [
            {"type": "function", "name": f["name"], "description": f.get("description"), "parameters": f["parameters"]}
            for f in _functions(conversation)
        ]
    return body


def grpc_edge(conversation: Conversation, kwargs: dict[str, Any]) -> chat_pb2.ChatRequest:
    """[grpc.messages] [grpc.tools] [grpc.kwargs]"""
    messages = []
    for m in conversation["messages"]:
        parts = []
        if m.get("reasoning_content") is not None:
            parts.append(chat_pb2.Part(reasoning=m["reasoning_content"]))
        if m.get("content") is not None:
            parts.append(chat_pb2.Part(text=m["content"]))
        parts += [
            chat_pb2.Part(
                tool_call=chat_pb2.ToolCall(id=c["id"], name=c["function"]["name"], arguments_json=_arguments(c))
            )
            for c in m.get("tool_calls") or []
        ]
        messages.append(
            chat_pb2.Message(
                role=m["role"], parts=parts, tool_call_id=m.get("tool_call_id", ""), name=m.get("name", "")
            )
        )
    tools = [
        chat_pb2.Tool(
            name=f["name"],
            description=f.get("description", ""),
            parameters_json=json.dumps(f["parameters"], ensure_ascii=False),
        )
        for f in _functions(conversation)
    ]
    return chat_pb2.ChatRequest(
        model="m", messages=messages, tools=tools, chat_template_kwargs_json=json.dumps(kwargs) if kwargs else ""
    )


def equivalent(api: str, conversation: Conversation) -> Conversation:
    """The OpenAI-form conversation ``api``'s request for ``conversation`` stands for (the mapping back)."""
    if api in ("openai_chat", "grpc_edge"):
        return conversation
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for m in copy.deepcopy(conversation["messages"]):
        if m["role"] == "assistant":
            for call in m.get("tool_calls") or []:
                names[call["id"]] = call["function"]["name"]
            if m.get("content") is None:
                m["content"] = ""  # [anthropic.assistant] [responses.assistant]: no null content
            if api == "responses" and out and out[-1]["role"] == "assistant":
                _merge(out[-1], m)  # [responses.assistant]: consecutive assistant items are one turn
                continue
        elif m["role"] == "tool":
            m["name"] = names.get(m["tool_call_id"], "")  # [anthropic.user] [responses.tool]
        out.append(m)
    if api == "anthropic" and out[-1]["role"] == "assistant":  # [anthropic.prefill]: the model continues it
        return {**conversation, "messages": out, "add_generation_prompt": False, "continue_final_message": True}
    return {**conversation, "messages": out}


def _merge(turn: dict[str, Any], more: dict[str, Any]) -> None:
    if more.get("reasoning_content") is not None:
        before = turn.get("reasoning_content")
        turn["reasoning_content"] = (
            more["reasoning_content"] if before is None else f"{before}\n{more['reasoning_content']}"
        )
    turn["content"] = (turn.get("content") or "") + (more.get("content") or "")
    if more.get("tool_calls"):
        turn["tool_calls"] = [*(turn.get("tool_calls") or []), *more["tool_calls"]]
