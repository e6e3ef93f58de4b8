"""A client that goes away mid-stream cancels the parse call (and so the worker's request)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest

from gateway.server import Gateway
from gateway.streaming import EventStreamResponse
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


# -- EventStreamResponse's own disconnect watch, driven as an ASGI server drives it -----------------------

class _Client:
    """An ASGI server's side of one streamed response: ``leave`` is the client disconnecting."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.left = asyncio.Event()
        self.first_chunk = asyncio.Event()

    async def receive(self) -> dict[str, object]:
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, object]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            self.sent.append(bytes(message["body"]))  # type: ignore[arg-type]
            self.first_chunk.set()


def _response(body: AsyncIterator[bytes], closed: list[str]) -> EventStreamResponse:
    async def on_close() -> None:
        await asyncio.sleep(0)  # an await: a pending cancel of the response's task would land here
        closed.append("closed")

    return EventStreamResponse(body, on_close=on_close)


async def test_event_stream_disconnect_ends_the_body_and_closes_quietly() -> None:
    ended: list[str] = []
    closed: list[str] = []

    async def body() -> AsyncIterator[bytes]:
        try:
            yield b"data: one\n\n"
            await asyncio.Event().wait()  # a model that never says more
            yield b"data: never\n\n"
        finally:
            ended.append("ended")

    client = _Client()
    call = asyncio.create_task(_response(body(), closed)({"type": "http"}, client.receive, client.send))
    await asyncio.wait_for(client.first_chunk.wait(), timeout=5)
    client.left.set()
    await asyncio.wait_for(call, timeout=5)  # returns normally: a disconnect is no error
    assert client.sent == [b"data: one\n\n"]
    assert closed == ["closed"]
    assert not call.cancelled()


async def test_event_stream_disconnect_after_the_end_cancels_nothing() -> None:
    closed: list[str] = []
    client = _Client()
    send = client.send

    async def send_then_leave(message: dict[str, object]) -> None:
        await send(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            client.left.set()  # the client goes as the last bytes leave

    async def body() -> AsyncIterator[bytes]:
        yield b"data: one\n\n"
        yield b"data: two\n\n"

    response = _response(body(), closed)
    await asyncio.wait_for(response({"type": "http"}, client.receive, send_then_leave), timeout=5)
    assert client.sent == [b"data: one\n\n", b"data: two\n\n"]
    assert closed == ["closed"]  # on_close was not cancelled by the late disconnect


async def test_event_stream_cancel_from_outside_still_propagates() -> None:
    closed: list[str] = []
    client = _Client()

    async def body() -> AsyncIterator[bytes]:
        yield b"data: one\n\n"
        await asyncio.Event().wait()
        yield b"data: never\n\n"

    call = asyncio.create_task(_response(body(), closed)({"type": "http"}, client.receive, client.send))
    await asyncio.wait_for(client.first_chunk.wait(), timeout=5)
    call.cancel()  # a server shutting down, not the client leaving
    with pytest.raises(asyncio.CancelledError):
        await call
    assert closed == ["closed"]  # the upstream call is still cancelled
