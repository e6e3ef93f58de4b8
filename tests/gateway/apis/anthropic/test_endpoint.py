"""The Anthropic endpoints over a fake parse service, through the official anthropic SDK and raw HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import httpx
import pytest

from gateway.apis.anthropic.encode import PING, MessageEncoder
from gateway.apis.anthropic.endpoint import MessagesApi
from gateway.apis.anthropic.signing import ThinkingSigner
from gateway.server import Gateway
from services.api import chat_pb2, common_pb2
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

pytestmark = pytest.mark.timeout(30)
HELLO = [{"role": "user", "content": "hello"}]


def sdk(gateway: Gateway, key: str = "sk-test") -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=gateway.http_url, api_key=key, max_retries=0, timeout=10)


async def test_stream_with_the_sdk(gateway: Gateway, fake: FakeParse) -> None:
    fake.script = [
        batch(started(30, 16), reasoning("think")),
        batch(text("\n\nRunning."), call_start(0, "c0", "Bash"), call_args(0, '{"command": "ls"}')),
        batch(dispatch(0, "c0", "Bash", '{"command": "ls"}'), usage(30, 8, cached=16),
              finish(common_pb2.FINISH_REASON_TOOL_CALLS)),
    ]
    async with sdk(gateway).messages.stream(model="demo", max_tokens=64, messages=HELLO) as stream:  # type: ignore[arg-type]
        message = await stream.get_final_message()
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.stop_reason == "tool_use"
    assert message.usage.input_tokens == 14 and message.usage.cache_read_input_tokens == 16
    assert fake.requests[-1].strip_billing_header


async def test_non_streaming_and_model_alias(gateway_factory: Any, fake_parse: tuple[FakeParse, str]) -> None:
    gw = await gateway_factory(fake_parse[1], model_alias=["claude-sonnet-x=demo"])
    message = await sdk(gw).messages.create(model="claude-sonnet-x", max_tokens=8, messages=HELLO)  # type: ignore[arg-type]
    assert message.model == "claude-sonnet-x" and message.content[0].type == "text"
    assert fake_parse[0].requests[-1].model == "demo"


async def test_typed_errors(gateway: Gateway, fake: FakeParse) -> None:
    client = sdk(gateway)
    with pytest.raises(anthropic.BadRequestError) as bad:
        await client.messages.create(model="demo", max_tokens=8, messages=[{"role": "user", "content": [  # type: ignore[list-item]
            {"type": "tool_result"}]}])
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "messages.0.content.0.tool_result.tool_use_id" in bad.value.message
    with pytest.raises(anthropic.NotFoundError):
        await client.messages.create(model="nope", max_tokens=8, messages=HELLO)  # type: ignore[arg-type]
    with pytest.raises(anthropic.BadRequestError, match="images"):
        await client.messages.create(model="demo", max_tokens=8, messages=[{"role": "user", "content": [  # type: ignore[list-item]
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    boom = common_pb2.Error(code=common_pb2.ERROR_CODE_INTERNAL, message="boom")
    fake.script = [batch(started(), text("partial")), batch(chat_pb2.ChatEvent(error=boom))]
    async with httpx.AsyncClient(base_url=gateway.http_url) as http:
        body = {"model": "demo", "max_tokens": 8, "messages": HELLO, "stream": True}
        r = await http.post("/v1/messages", json=body)
    assert r.status_code == 200
    # An internal error names the request, never what went wrong inside (that is logged with the same id).
    message_id = r.text.split('"id":"', 1)[1].split('"', 1)[0]
    assert ('event: error\ndata: {"type":"error","error":{"type":"api_error","message":'
            f'"internal error (request id: {message_id})"}}') in r.text
    assert "boom" not in r.text
    assert "[DONE]" not in r.text


async def test_api_key_either_header_and_anthropic_401(gateway_factory: Any, fake_parse: tuple[FakeParse, str]) -> None:
    gw = await gateway_factory(fake_parse[1], api_key=["k1"])
    assert (await sdk(gw, "k1").messages.create(model="demo", max_tokens=8, messages=HELLO)).content  # type: ignore[arg-type]
    async with httpx.AsyncClient(base_url=gw.http_url) as http:
        ok = await http.post("/v1/messages", headers={"x-api-key": "k1", "anthropic-version": "2023-06-01"},
                             json={"model": "demo", "max_tokens": 8, "messages": HELLO})
        assert ok.status_code == 200
        bad = await http.post("/v1/messages?beta=true", headers={"x-api-key": "wrong"},
                              json={"model": "demo", "max_tokens": 8, "messages": HELLO})
    assert bad.status_code == 401
    assert bad.json()["type"] == "error" and bad.json()["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        await sdk(gw, "wrong").messages.create(model="demo", max_tokens=8, messages=HELLO)  # type: ignore[arg-type]


async def test_count_tokens_uses_the_chat_conversion(gateway: Gateway, fake: FakeParse) -> None:
    count = await sdk(gateway).messages.count_tokens(model="demo", messages=HELLO, system="sys")  # type: ignore[arg-type]
    assert count.input_tokens == 3
    chat = fake.tokenize_requests[-1].chat
    assert [m.role for m in chat.messages] == ["system", "user"] and chat.strip_billing_header


async def test_models_in_both_shapes(gateway_factory: Any, fake_parse: tuple[FakeParse, str]) -> None:
    gw = await gateway_factory(fake_parse[1], model_alias=["claude-x=demo"])
    page = await sdk(gw).models.list()
    assert [m.id for m in page.data] == ["demo", "claude-x"]
    async with httpx.AsyncClient(base_url=gw.http_url) as http:
        raw = (await http.get("/v1/models", headers={"anthropic-version": "2023-06-01"})).json()
        assert raw["has_more"] is False and raw["first_id"] == "demo" and raw["last_id"] == "claude-x"
        assert raw["data"][0]["max_input_tokens"] == 4096 and raw["data"][0]["type"] == "model"
        one = (await http.get("/v1/models/claude-x", headers={"anthropic-version": "2026-10-21"})).json()
        assert one["id"] == "claude-x" and one["created_at"].endswith("Z")
        openai_shape = (await http.get("/v1/models")).json()
        assert openai_shape["object"] == "list"


async def test_anthropic_api_can_be_disabled(gateway_factory: Any, fake_parse: tuple[FakeParse, str]) -> None:
    gw = await gateway_factory(fake_parse[1], enable_anthropic_api=False)
    async with httpx.AsyncClient(base_url=gw.http_url) as http:
        r = await http.post("/v1/messages", json={"model": "demo", "max_tokens": 8, "messages": HELLO})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


async def test_ping_on_long_gaps(fake: FakeParse, gateway: Gateway) -> None:
    fake.script = [batch(started(), text("a"))]
    fake.hang = True
    api = MessagesApi(gateway.parse, ThinkingSigner(), ping_interval=0.05)
    encoder_stream = api._parse.chat(chat_pb2.ChatRequest(model="demo", messages=[chat_pb2.Message(
        role="user", parts=[chat_pb2.Part(text="x")])]))
    encoder = MessageEncoder("m", "demo", ThinkingSigner())
    first = await anext(encoder_stream)
    frames = api.endpoint._body(encoder.feed(first), encoder_stream, encoder, "m", None)
    got = [await anext(frames) for _ in range(3)]
    assert got[1] == PING and got[2] == PING
    await frames.aclose()
    await encoder_stream.aclose()
    await asyncio.sleep(0)
