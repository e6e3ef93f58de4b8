"""A client that goes away mid-stream cancels the parse call (and so the worker's request)."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import httpx

from gateway.server import Gateway
from services.api import chat_pb2, chat_pb2_grpc
from tests.gateway.fake_parse import FakeParse, batch, started, text


async def test_http_disconnect_cancels_parse_call(gateway: Gateway, fake: FakeParse) -> None:
    fake.script = [batch(started(), text("first"))]
    fake.hang = True
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    url = gateway.http_url + "/v1/chat/completions"
    async with httpx.AsyncClient() as http, http.stream("POST", url, json=body) as response:
        async for line in response.aiter_lines():
            if "first" in line:
                break
    await asyncio.wait_for(fake.cancelled.wait(), timeout=5)


async def test_grpc_edge_cancel_cancels_parse_call(gateway: Gateway, fake: FakeParse) -> None:
    fake.script = [batch(started(), text("first"))]
    fake.hang = True
    async with grpc.aio.insecure_channel(gateway.grpc_address) as channel:
        stub = chat_pb2_grpc.AgentServiceStub(channel)
        call = stub.Chat(chat_pb2.ChatRequest(model="demo", messages=[chat_pb2.Message(role="user")]))
        first = await call.read()
        assert isinstance(first, chat_pb2.ChatEventBatch)
        call.cancel()
    await asyncio.wait_for(fake.cancelled.wait(), timeout=5)


async def test_non_stream_disconnect_cancels_parse_call(gateway: Gateway, fake: FakeParse) -> None:
    fake.script = [batch(started(), text("first"))]
    fake.hang = True
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(timeout=0.5) as http:
        with contextlib.suppress(httpx.ReadTimeout):
            await http.post(gateway.http_url + "/v1/chat/completions", json=body)
    await asyncio.wait_for(fake.cancelled.wait(), timeout=5)
