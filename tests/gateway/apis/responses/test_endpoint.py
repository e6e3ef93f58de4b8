"""``POST /v1/responses`` driven by the official openai SDK against real uvicorn and a fake parse service."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from gateway.server import Gateway
from services.api import chat_pb2, common_pb2
from tests.gateway.fake_parse import (
    FakeParse,
    batch,
    call_args,
    call_start,
    dispatch,
    error,
    finish,
    reasoning,
    started,
    text,
    usage,
)

WEATHER: Any = [{"type": "function", "name": "get_weather", "description": "weather",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]


def tool_turn() -> list[chat_pb2.ChatEventBatch]:
    return [
        batch(started(20, 0), reasoning("need "), reasoning("weather")),
        batch(call_start(0, "call_a", "get_weather"), call_args(0, '{"city": ')),
        batch(call_args(0, '"Paris"}'), dispatch(0, "call_a", "get_weather", '{"city": "Paris"}')),
        batch(finish(common_pb2.FINISH_REASON_TOOL_CALLS), usage(20, 12, 0, 3)),
    ]


def answer_turn(cached: int) -> list[chat_pb2.ChatEventBatch]:
    return [batch(started(40, cached), text("It is "), text("sunny.")), batch(finish(), usage(40, 4, cached))]


async def test_stream_tool_loop_with_previous_response_id(client: openai.AsyncOpenAI, fake: FakeParse) -> None:
    fake.script = tool_turn()
    stream = await client.responses.create(model="demo", input="Weather in Paris?", tools=WEATHER, stream=True)
    events = [e async for e in stream]
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # The call's item is done as soon as it is dispatched, before the turn ends.
    done = [e for e in events if e.type == "response.output_item.done"]
    assert [d.item.type for d in done] == ["reasoning", "function_call"]
    call_done = next(i for i, e in enumerate(events)
                     if e.type == "response.output_item.done" and e.item.type == "function_call")
    assert types[call_done - 1] == "response.function_call_arguments.done"
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(deltas) == {"city": "Paris"}
    summary = "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta")
    raw = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert summary == raw == "need weather"
    completed: Any = events[-1]
    response = completed.response
    call = response.output[1]
    assert call.type == "function_call" and call.call_id == "call_a" and call.name == "get_weather"
    assert call.id == done[1].item.id
    assert response.usage.input_tokens == 20 and response.usage.output_tokens_details.reasoning_tokens == 3

    fake.script = answer_turn(cached=16)
    second = await client.responses.create(
        model="demo", previous_response_id=response.id, tools=WEATHER, stream=True,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "22 degrees"}],
    )
    events2 = [e async for e in second]
    final: Any = events2[-1]
    assert final.type == "response.completed"
    assert final.response.output_text == "It is sunny."
    assert final.response.usage.input_tokens_details.cached_tokens == 16
    roles = [m.role for m in fake.requests[-1].messages]
    assert roles == ["user", "assistant", "tool"]
    assistant = fake.requests[-1].messages[1]
    assert [p.WhichOneof("kind") for p in assistant.parts] == ["reasoning", "tool_call", "text"]  # content ""
    assert fake.requests[-1].messages[2].tool_call_id == "call_a"
    assert fake.requests[-1].messages[2].name == "get_weather"


async def test_non_streaming_and_manual_replay(client: openai.AsyncOpenAI, fake: FakeParse) -> None:
    fake.script = tool_turn()
    first = await client.responses.create(model="demo", input="Weather?", tools=WEATHER, store=False,
                                          include=["reasoning.encrypted_content"])
    assert first.status == "completed"
    kinds = [o.type for o in first.output]
    assert kinds == ["reasoning", "function_call"]
    rs: Any = first.output[0]
    assert rs.encrypted_content and rs.summary[0].text == "need weather"
    # Stateless replay, the way Codex does it: reasoning comes back with encrypted_content only.
    fake.script = answer_turn(cached=0)
    items: Any = [
        {"role": "user", "content": "Weather?"},
        {"type": "reasoning", "id": rs.id, "summary": [], "encrypted_content": rs.encrypted_content},
        first.output[1].model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": first.output[1].call_id, "output": "22 degrees"},
    ]
    second = await client.responses.create(model="demo", input=items, tools=WEATHER)
    assert second.output_text == "It is sunny."
    assistant = fake.requests[-1].messages[1]
    assert assistant.parts[0].reasoning == "need weather"
    assert assistant.parts[1].tool_call.arguments_json == '{"city": "Paris"}'


async def test_unknown_previous_response_is_a_400(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(model="demo", input="hi", previous_response_id="resp_nope")
    body: Any = info.value.body
    assert body["param"] == "previous_response_id" and body["type"] == "invalid_request_error"


async def test_store_false_is_not_kept(client: openai.AsyncOpenAI, fake: FakeParse) -> None:
    first = await client.responses.create(model="demo", input="hi", store=False)
    with pytest.raises(openai.BadRequestError):
        await client.responses.create(model="demo", input="again", previous_response_id=first.id)


async def test_length_finish_is_incomplete(client: openai.AsyncOpenAI, fake: FakeParse) -> None:
    fake.script = [batch(started(), text("abc"), finish(common_pb2.FINISH_REASON_LENGTH), usage(7, 3))]
    stream = await client.responses.create(model="demo", input="hi", max_output_tokens=3, stream=True)
    events = [e async for e in stream]
    last: Any = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.incomplete_details.reason == "max_output_tokens"
    assert fake.requests[-1].sampling.max_tokens == 3


async def test_error_before_output_keeps_its_status(client: openai.AsyncOpenAI, fake: FakeParse) -> None:
    fake.script = [batch(error(common_pb2.ERROR_CODE_CONTEXT_LENGTH, "prompt too long"))]
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(model="demo", input="hi", stream=True)
    body: Any = info.value.body
    assert body["code"] == "context_length_exceeded"


async def test_error_after_output_is_response_failed(client: openai.AsyncOpenAI, fake: FakeParse) -> None:
    fake.script = [batch(started(), text("par")), batch(error(common_pb2.ERROR_CODE_UNAVAILABLE, "worker died"))]
    stream = await client.responses.create(model="demo", input="hi", stream=True)
    events = [e async for e in stream]
    last: Any = events[-1]
    assert last.type == "response.failed"
    assert last.response.status == "failed"
    assert last.response.error.message == "worker died"
    assert last.response.error.code == "service_unavailable"


async def test_unknown_model_is_404(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(model="nope", input="hi")


async def test_malformed_fields_are_400_naming_them(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.http_url, timeout=10) as http:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
            ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
            ({"input": "hi", "tools": [{"type": "function"}]}, "tools[0].name"),
            ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
             "input[0].content[0].type"),
            ({"input": "hi", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ]
        for body, param in cases:
            reply = await http.post("/v1/responses", json={"model": "demo", **body})
            assert reply.status_code == 400, (body, reply.text)
            err = reply.json()["error"]
            assert err["param"] == param, (body, err)
            assert err["type"] == "invalid_request_error"


async def test_unknown_fields_are_ignored_and_unknown_items_refused(gateway: Gateway, fake: FakeParse) -> None:
    body = {"model": "demo", "input": [{"role": "user", "content": "hi"}],
            "frobnicate": True, "metadata": {"k": "v"}, "client_metadata": {"a": 1}}
    async with httpx.AsyncClient(base_url=gateway.http_url, timeout=10) as http:
        reply = await http.post("/v1/responses", json=body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["metadata"] == {"k": "v"}
        assert [m.role for m in fake.requests[-1].messages] == ["user"]
        sent = len(fake.requests)
        # An item type the gateway does not know is never dropped: a 400 naming it.
        hi = {"role": "user", "content": "hi"}
        for items, param in [([hi, {"type": "item_reference", "id": "x"}], "input[1].type"),
                             ([{"content": "no type, no role"}], "input[0].type"),
                             ([{"type": "compaction_trigger"}, hi], "input[0].type")]:
            reply = await http.post("/v1/responses", json={"model": "demo", "input": items})
            assert reply.status_code == 400, reply.text
            assert reply.json()["error"]["param"] == param, reply.text
    assert len(fake.requests) == sent
