"""The OpenAI chat completions adapter, driven by the official openai SDK against real uvicorn."""

from __future__ import annotations

import json
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

MESSAGES: Any = [{"role": "user", "content": "hi"}]


async def test_stream_reasoning_then_text(client: openai.AsyncOpenAI, fake: FakeParse) -> None:
    fake.script = [
        batch(started()),
        batch(reasoning("think"), reasoning("ing")),
        batch(reasoning("."), text("Hel")),
        batch(text("lo"), finish(), usage(7, 5)),
    ]
    stream = await client.chat.completions.create(model="demo", messages=MESSAGES, stream=True)
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    reasoning_text = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reasoning_text == "thinking."
    assert content == "Hello"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.object == "chat.completion.chunk" and c.model == "demo" for c in chunks)
    assert len({c.id for c in chunks}) == 1


async def test_stream_tool_call(client: openai.AsyncOpenAI, fake: FakeParse) -> None:
    fake.script = [
        batch(started(), reasoning("need weather")),
        batch(call_start(0, "call_a", "get_weather"), call_args(0, '{"city": ')),
        batch(call_args(0, '"Paris"}'), dispatch(0, "call_a", "get_weather", '{"city": "Paris"}')),
        batch(finish(common_pb2.FINISH_REASON_TOOL_CALLS), usage(9, 12)),
    ]
    tools: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    stream = await client.chat.completions.create(
        model="demo", messages=MESSAGES, tools=tools, stream=True
    )
    name, args, call_id, finish_reason = "", "", "", None
    async for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        for tc in choice.delta.tool_calls or ():
            assert tc.index == 0
            call_id = tc.id or call_id
            name += (tc.function.name or "") if tc.function else ""
            args += (tc.function.arguments or "") if tc.function else ""
        finish_reason = choice.finish_reason or finish_reason
    assert (call_id, name, json.loads(args)) == ("call_a", "get_weather", {"city": "Paris"})
    assert finish_reason == "tool_calls"
    request = fake.requests[0]
    assert request.tools[0].name == "get_weather"
    assert json.loads(request.tools[0].parameters_json) == {"type": "object"}


async def test_stream_include_usage(client: openai.AsyncOpenAI, fake: FakeParse) -> None:
    fake.script = [batch(started(20, 16), text("ok")), batch(finish(), usage(20, 3, cached=16))]
    stream = await client.chat.completions.create(
        model="demo", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (20, 3, 23)
    assert last.usage.prompt_tokens_details is not None
    assert last.usage.prompt_tokens_details.cached_tokens == 16
    assert all(c.usage is None for c in chunks[:-1])


async def test_one_sse_chunk_per_text_batch(gateway: Gateway, fake: FakeParse) -> None:
    fake.script = [batch(started(), text("a"), text("b"), text("c")), batch(text("d"), text("e")), batch(finish())]
    body = {"model": "demo", "messages": MESSAGES, "stream": True}
    async with httpx.AsyncClient() as http:
        response = await http.post(gateway.http_url + "/v1/chat/completions", json=body)
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas == [{"role": "assistant", "content": "abc"}, {"content": "de"}, {}]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert response.headers["content-type"].startswith("text/event-stream")


async def test_non_stream_aggregates(client: openai.AsyncOpenAI, fake: FakeParse) -> None:
    fake.script = [
        batch(started(30, 8), reasoning("hmm")),
        batch(text("Let me check. "), call_start(0, "call_1", "get_weather"), call_args(0, '{"city":"Oslo"}')),
        batch(dispatch(0, "call_1", "get_weather", '{"city":"Oslo"}')),
        batch(finish(common_pb2.FINISH_REASON_TOOL_CALLS), usage(30, 11, cached=8, reasoning_tokens=2)),
    ]
    completion = await client.chat.completions.create(model="demo", messages=MESSAGES)
    choice = completion.choices[0]
    assert completion.object == "chat.completion"
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check. "
    assert getattr(choice.message, "reasoning_content", None) == "hmm"
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert (call.id, call.function.name, call.function.arguments) == ("call_1", "get_weather", '{"city":"Oslo"}')  # type: ignore[union-attr]
    assert completion.usage is not None
    assert completion.usage.total_tokens == 41
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 8
    assert completion.usage.completion_tokens_details is not None
    assert completion.usage.completion_tokens_details.reasoning_tokens == 2


async def test_non_stream_without_text_has_null_content(client: openai.AsyncOpenAI, fake: FakeParse) -> None:
    fake.script = [batch(started(), finish(common_pb2.FINISH_REASON_LENGTH), usage(1, 0))]
    completion = await client.chat.completions.create(model="demo", messages=MESSAGES)
    assert completion.choices[0].message.content is None
    assert completion.choices[0].finish_reason == "length"


async def test_request_mapping(client: openai.AsyncOpenAI, fake: FakeParse) -> None:
    messages: Any = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "weather "}, {"type": "text", "text": "in Paris?"}]},
        {
            "role": "assistant",
            "content": "checking",
            "reasoning_content": "use the tool",
            "tool_calls": [
                {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": '{"c":1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_9", "content": "sunny"},
        {"role": "assistant", "content": "done", "reasoning": "alt field"},
    ]
    tools: Any = [{"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {}}}]
    await client.chat.completions.create(
        model="demo",
        messages=messages,
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_completion_tokens=77,
        temperature=0.5,
        top_p=0.9,
        stop="END",
        seed=3,
        extra_body={
            "chat_template_kwargs": {"enable_thinking": False},
            "nvext": {
                "agent_hints": {"priority": 5, "osl": 100, "speculative_prefill": True},
                "agent_context": {"session_id": "s1"},
            },
        },
        extra_headers={"x-trajectory-id": "t1", "x-harnessmesh-priority": "1"},
    )
    req = fake.requests[0]
    assert req.model == "demo" and req.request_id.startswith("chatcmpl-")
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert req.messages[1].parts[0].text == "weather in Paris?"
    kinds = [p.WhichOneof("kind") for p in req.messages[2].parts]
    assert kinds == ["reasoning", "text", "tool_call"]
    assert req.messages[2].parts[2].tool_call.arguments_json == '{"c":1}'
    assert req.messages[3].tool_call_id == "call_9" and req.messages[3].parts[0].text == "sunny"
    assert req.messages[4].parts[0].reasoning == "alt field"
    assert (req.tool_choice.mode, req.tool_choice.name) == ("named", "get_weather")
    assert req.sampling.max_tokens == 77 and list(req.sampling.stop) == ["END"] and req.sampling.seed == 3
    assert abs(req.sampling.temperature - 0.5) < 1e-6 and abs(req.sampling.top_p - 0.9) < 1e-6
    assert not req.sampling.HasField("top_k")
    assert json.loads(req.chat_template_kwargs_json) == {"enable_thinking": False}
    assert (req.hints.priority, req.hints.osl, req.hints.speculative_prefill) == (5, 100, True)
    assert (req.identity.session_id, req.identity.trajectory_id) == ("s1", "t1")
    assert req.identity.harness == "openai-python"
    assert req.add_generation_prompt and not req.continue_final_message


async def test_headers_give_identity_and_hints(gateway: Gateway, fake: FakeParse) -> None:
    headers = {
        "x-session-id": "sess",
        "x-harnessmesh-priority": "3",
        "x-harnessmesh-osl": "42",
        "x-harnessmesh-speculative-prefill": "true",
        "user-agent": "claude-cli/2.1.330 (external, cli)",
    }
    body = {"model": "demo", "messages": MESSAGES, "max_tokens": 9, "stop": ["a", "b"]}
    async with httpx.AsyncClient() as http:
        response = await http.post(gateway.http_url + "/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200
    req = fake.requests[0]
    assert req.identity.session_id == "sess" and req.identity.harness == "claude-code"
    assert (req.hints.priority, req.hints.osl, req.hints.speculative_prefill) == (3, 42, True)
    assert req.sampling.max_tokens == 9 and list(req.sampling.stop) == ["a", "b"]
