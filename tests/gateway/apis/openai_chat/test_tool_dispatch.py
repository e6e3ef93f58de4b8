"""``--enable-streaming-tool-dispatch``: a named SSE event per dispatched call, still a valid chunk for the SDK."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import openai

from gateway.server import Gateway
from services.api import common_pb2
from tests.gateway.fake_parse import (
    FakeParse,
    batch,
    call_args,
    call_start,
    dispatch,
    finish,
    reasoning,
    started,
    text,
    usage,
)

MESSAGES: list[Any] = [{"role": "user", "content": "weather in Paris and Lyon?"}]
PARIS, LYON = '{"city": "Paris"}', '{"city": "Lyon"}'
SCRIPT = [
    batch(started(), reasoning("Paris first."), call_start(0, "call_a", "get_weather"), call_args(0, '{"city": ')),
    batch(call_args(0, '"Paris"}'), dispatch(0, "call_a", "get_weather", PARIS), reasoning("Now Lyon.")),
    batch(call_start(1, "call_b", "get_weather"), call_args(1, LYON), dispatch(1, "call_b", "get_weather", LYON)),
    batch(text("Checking both."), finish(common_pb2.FINISH_REASON_STOP), usage(7, 20)),
]
GatewayFactory = Callable[..., Awaitable[Gateway]]


def sse_events(body: str) -> list[tuple[str | None, dict[str, Any] | str]]:
    out: list[tuple[str | None, dict[str, Any] | str]] = []
    for frame in body.strip().split("\n\n"):
        name, data = None, ""
        for line in frame.splitlines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data = line[len("data: "):]
        out.append((name, data if data == "[DONE]" else json.loads(data)))
    return out


async def test_dispatch_events_are_named_per_call_and_in_order(
    fake_parse: tuple[FakeParse, str], gateway_factory: GatewayFactory
) -> None:
    fake, address = fake_parse
    fake.script = SCRIPT
    gw = await gateway_factory(address, enable_streaming_tool_dispatch=True)
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.post(gw.http_url + "/v1/chat/completions",
                                   json={"model": "demo", "messages": MESSAGES, "stream": True})
    events = sse_events(response.text)
    named = [(i, data) for i, (name, data) in enumerate(events) if name == "tool_call_dispatch"]
    assert [d["tool_call_dispatch"] for _, d in named] == [  # type: ignore[index]
        {"choice_index": 0, "tool_call": {"id": "call_a", "type": "function",
                                          "function": {"name": "get_weather", "arguments": PARIS}}},
        {"choice_index": 0, "tool_call": {"id": "call_b", "type": "function",
                                          "function": {"name": "get_weather", "arguments": LYON}}},
    ]
    for _, data in named:
        assert isinstance(data, dict)
        assert data["object"] == "chat.completion.chunk" and data["choices"] == []
    kinds = []
    for name, data in events:
        if name or not isinstance(data, dict) or not data["choices"]:
            kinds.append(name or "other")
            continue
        choice = data["choices"][0]
        kinds.append("finish" if choice["finish_reason"] else next(iter(k for k in choice["delta"] if k != "role")))
    # reasoning, the first call's arguments, its dispatch, reasoning, the second call, its dispatch, text, finish
    assert [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]] == [
        "reasoning_content", "tool_calls", "tool_call_dispatch", "reasoning_content", "tool_calls",
        "tool_call_dispatch", "content", "finish", "other"]


async def test_the_openai_sdk_iterates_a_stream_with_dispatch_events(
    fake_parse: tuple[FakeParse, str], gateway_factory: GatewayFactory
) -> None:
    fake, address = fake_parse
    fake.script = SCRIPT
    gw = await gateway_factory(address, enable_streaming_tool_dispatch=True)
    client = openai.AsyncOpenAI(base_url=gw.http_url + "/v1", api_key="sk-test", max_retries=0, timeout=10)
    stream = await client.chat.completions.create(model="demo", messages=MESSAGES, stream=True)
    arguments: dict[int, str] = {}
    dispatched: list[str] = []
    finish_reason = None
    async for chunk in stream:
        extra = chunk.model_extra or {}
        if "tool_call_dispatch" in extra:
            dispatched.append(extra["tool_call_dispatch"]["tool_call"]["id"])
        for choice in chunk.choices:  # an ordinary SDK loop: no TypeError on the dispatch chunks
            for call in choice.delta.tool_calls or []:
                arguments[call.index] = arguments.get(call.index, "") + (call.function.arguments or "")  # type: ignore[union-attr]
            finish_reason = choice.finish_reason or finish_reason
    assert dispatched == ["call_a", "call_b"]
    assert arguments == {0: PARIS, 1: LYON}
    assert finish_reason == "tool_calls"


async def test_no_dispatch_events_by_default(client: openai.AsyncOpenAI, gateway: Gateway, fake: FakeParse) -> None:
    fake.script = SCRIPT
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.post(gateway.http_url + "/v1/chat/completions",
                                   json={"model": "demo", "messages": MESSAGES, "stream": True})
    assert "event:" not in response.text and "tool_call_dispatch" not in response.text
