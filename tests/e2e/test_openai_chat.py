"""The real mesh through the official openai SDK: reasoning, streamed tool calls, prefix caching."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import WEATHER_TOOL
from tests.support.mesh import RunningMesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SYSTEM = "You are a helpful assistant that uses tools. " * 8


def client(mesh: RunningMesh) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=mesh.http + "/v1", api_key="sk-test", max_retries=0)


def first_turn(question: str = "What is the weather in Paris today?") -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


async def test_streamed_reasoning_and_tool_call(mesh: RunningMesh) -> None:
    stream = await client(mesh).chat.completions.create(
        model="demo", messages=first_turn(), tools=[WEATHER_TOOL], stream=True,  # type: ignore[arg-type,list-item]
        stream_options={"include_usage": True},
    )
    reasoning, names, args, finish, usage = [], [], [], None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta: Any = choice.delta
            if getattr(delta, "reasoning_content", None):
                reasoning.append(delta.reasoning_content)
            for call in delta.tool_calls or []:
                if call.function and call.function.name:
                    names.append(call.function.name)
                if call.function and call.function.arguments:
                    args.append(call.function.arguments)
            if choice.finish_reason:
                finish = choice.finish_reason
    assert "call get_weather" in "".join(reasoning)
    assert names == ["get_weather"]
    assert json.loads("".join(args)) == {"city": "Paris", "unit": "celsius"}
    assert finish == "tool_calls"
    assert usage is not None and usage.prompt_tokens > 0 and usage.completion_tokens > 0


async def test_second_turn_hits_the_prefix_cache(mesh: RunningMesh) -> None:
    api = client(mesh)
    first = await api.chat.completions.create(model="demo", messages=first_turn(), tools=[WEATHER_TOOL])  # type: ignore[arg-type,list-item]
    message: Any = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    call = message.tool_calls[0]
    assert call.function.name == "get_weather"
    messages = [
        *first_turn(),
        {"role": "assistant", "content": message.content, "reasoning_content": message.reasoning_content,
         "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "22 degrees, sunny"},
    ]
    second = await api.chat.completions.create(model="demo", messages=messages, tools=[WEATHER_TOOL])  # type: ignore[arg-type]
    assert second.choices[0].finish_reason == "stop"
    assert "22 degrees" in (second.choices[0].message.content or "")
    usage: Any = second.usage
    assert usage.prompt_tokens > first.usage.prompt_tokens  # type: ignore[union-attr]
    # The first turn's whole prompt is a prefix of the second's: at least its full blocks are cached.
    assert usage.prompt_tokens_details.cached_tokens >= (first.usage.prompt_tokens // 16) * 16 - 16  # type: ignore[union-attr]
    assert usage.prompt_tokens_details.cached_tokens > 0


async def test_tokenize_matches_what_a_chat_request_sends(mesh: RunningMesh) -> None:
    body = {"model": "demo", "messages": first_turn("Say hello"), "tools": [WEATHER_TOOL]}
    async with httpx.AsyncClient(base_url=mesh.http, timeout=30) as http:
        tokens = (await http.post("/tokenize", json=body)).json()
        chat = (await http.post("/v1/chat/completions", json={**body, "max_tokens": 4})).json()
        text = (await http.post("/detokenize", json={"model": "demo", "tokens": tokens["tokens"]})).json()
    assert tokens["count"] == len(tokens["tokens"]) == chat["usage"]["prompt_tokens"]
    assert tokens["max_model_len"] > 0
    assert text["prompt"].startswith("<|im_start|>system\n")


async def test_errors_in_openai_shape(mesh: RunningMesh) -> None:
    async with httpx.AsyncClient(base_url=mesh.http, timeout=30) as http:
        unknown = await http.post("/v1/chat/completions", json={"model": "nope", "messages": first_turn()})
        malformed = await http.post("/v1/chat/completions", json={"model": "demo", "messages": "hi"})
        models = await http.get("/v1/models")
        ready = await http.get("/ready")
    assert unknown.status_code == 404 and "nope" in unknown.json()["error"]["message"]
    assert malformed.status_code == 400 and malformed.json()["error"]["param"]
    assert [m["id"] for m in models.json()["data"]] == ["demo"]
    assert ready.status_code == 200
