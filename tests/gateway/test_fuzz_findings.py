"""Regressions of the fuzz run's findings (issue 14, ``bench/fuzz.py``): each was a 500 or a gRPC UNKNOWN,
each is now a 400 / INVALID_ARGUMENT naming what is wrong."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest

from gateway.apis.grpc_edge.service import AgentServicer, add_agent_service
from gateway.server import Gateway
from services.api import chat_pb2

BASE = {"model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
ANTHROPIC = {"content-type": "application/json", "anthropic-version": "2023-06-01"}


async def post(gateway: Gateway, path: str, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    async with httpx.AsyncClient(timeout=20) as http:
        return await http.post(gateway.http_url + path, content=body,
                               headers=headers or {"content-type": "application/json"})


async def test_anthropic_block_type_that_is_not_a_string(gateway: Gateway) -> None:
    """Was ``TypeError: unhashable type: 'dict'`` in the block discriminator: a 500."""
    body = {**BASE, "messages": [{"role": "user", "content": [{"type": {}, "text": "x"}]}]}
    response = await post(gateway, "/v1/messages", json.dumps(body).encode(), ANTHROPIC)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("messages.0.content.0.type: "), error  # no internal ``unknown`` tag


@pytest.mark.parametrize(("where", "value"), [("nvext", 2**40), ("nvext", -(2**31) - 1), ("header", 2**31),
                                              ("header", 99999999999999999999)])
@pytest.mark.parametrize("name", ["priority", "osl"])
async def test_hints_beyond_32_bits_are_a_400_naming_them(gateway: Gateway, where: str, value: int,
                                                          name: str) -> None:
    """Was ``ValueError: Value out of range`` building ``AgentHints``: a 500."""
    body: dict[str, object] = dict(BASE)
    headers = {"content-type": "application/json"}
    if where == "nvext":
        body["nvext"] = {"agent_hints": {name: value}}
    else:
        headers[f"x-harnessmesh-{name}"] = str(value)
    response = await post(gateway, "/v1/chat/completions", json.dumps(body).encode(), headers)
    assert response.status_code == 400, response.text
    param = f"nvext.agent_hints.{name}" if where == "nvext" else f"x-harnessmesh-{name}"
    assert response.json()["error"]["param"] == param


DEEP: dict[str, object] = {"type": "object", "properties": {"x": {}}}
for _ in range(400):
    DEEP = {"anyOf": [DEEP]}  # 801 levels: orjson parses it, the stdlib encoder of the converters could not


@pytest.mark.parametrize(("path", "tools"), [
    ("/v1/chat/completions", [{"type": "function", "function": {"name": "f", "parameters": DEEP}}]),
    ("/v1/messages", [{"name": "f", "input_schema": DEEP}]),
    ("/v1/responses", [{"type": "function", "name": "f", "parameters": DEEP}]),
    ("/tokenize", [{"type": "function", "function": {"name": "f", "parameters": DEEP}}]),
])
async def test_a_body_nested_too_deeply_to_convert_is_a_400(gateway: Gateway, path: str,
                                                            tools: list[object]) -> None:
    """Was ``RecursionError`` in ``json.dumps`` of the tool schema: a 500 (and the connection dropped)."""
    body = {**BASE, "input": "hi", "tools": tools}
    response = await post(gateway, path, json.dumps(body).encode(), ANTHROPIC)
    assert response.status_code == 400, response.text
    assert "nests deeper than" in response.json()["error"]["message"]


async def test_a_body_just_within_the_depth_limit_is_served(gateway: Gateway) -> None:
    schema: dict[str, object] = {"type": "object"}
    for _ in range(100):
        schema = {"anyOf": [schema]}  # 201 levels plus the body's own
    body = {**BASE, "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]}
    response = await post(gateway, "/v1/chat/completions", json.dumps(body).encode())
    assert response.status_code == 200, response.text


@pytest.fixture
async def agent_service() -> AsyncIterator[str]:
    """``AgentService`` registered by ``add_agent_service`` (no parse behind it: undecodable calls never reach it)."""
    server = grpc.aio.server()
    add_agent_service(AgentServicer(parse=None), server)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(0)


@pytest.mark.parametrize("raw", [b"\x12\x03\xff\xfe\xfd", b"\x1a\xff\xff\xff\xff\x0f", b"\x18\x05\x07", b"\xff"])
async def test_undecodable_grpc_request_is_invalid_argument(agent_service: str, raw: bytes) -> None:
    """Was UNKNOWN (``DecodeError`` raised by gRPC's deserializer before any handler ran)."""
    async with grpc.aio.insecure_channel(agent_service) as channel:
        chat = channel.unary_stream("/harnessmesh.v1.AgentService/Chat", request_serializer=lambda b: b,
                                    response_deserializer=chat_pb2.ChatEventBatch.FromString)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in chat(raw):
                pass
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid harnessmesh.v1.ChatRequest" in (info.value.details() or "")
        get_model = channel.unary_unary("/harnessmesh.v1.AgentService/GetModel", request_serializer=lambda b: b,
                                        response_deserializer=chat_pb2.ModelInfo.FromString)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await get_model(b"\xff")  # the bytes above may be a valid (empty) ModelInfoRequest
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
