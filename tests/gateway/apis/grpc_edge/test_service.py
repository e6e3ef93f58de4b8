"""The AgentService gRPC edge: validated pass-through with the mesh's error mapping."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from gateway.server import Gateway
from services.api import chat_pb2, chat_pb2_grpc, common_pb2
from services.common import errors
from tests.gateway.fake_parse import FakeParse, batch, error, finish, started, text

USER = chat_pb2.Message(role="user", parts=[chat_pb2.Part(text="hi")])


@pytest.fixture
async def stub(gateway: Gateway) -> AsyncIterator[chat_pb2_grpc.AgentServiceAsyncStub]:
    async with grpc.aio.insecure_channel(gateway.grpc_address) as channel:
        yield chat_pb2_grpc.AgentServiceStub(channel)  # type: ignore[misc]


async def test_chat_passes_batches_through(stub: chat_pb2_grpc.AgentServiceAsyncStub, fake: FakeParse) -> None:
    fake.script = [batch(started(), text("a"), text("b")), batch(finish())]
    request = chat_pb2.ChatRequest(model="demo", messages=[USER], identity=common_pb2.Identity(session_id="s"))
    frames = [b async for b in stub.Chat(request)]
    assert frames == fake.script
    assert fake.requests[0].identity.session_id == "s"


async def test_empty_model_means_served_model(stub: chat_pb2_grpc.AgentServiceAsyncStub, fake: FakeParse) -> None:
    [_ async for _ in stub.Chat(chat_pb2.ChatRequest(messages=[USER]))]
    assert fake.requests[0].model == "demo"


async def test_validation_errors(stub: chat_pb2_grpc.AgentServiceAsyncStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        [_ async for _ in stub.Chat(chat_pb2.ChatRequest(model="demo"))]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert errors.from_rpc_error(info.value).param == "messages"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        [_ async for _ in stub.Chat(chat_pb2.ChatRequest(model="other", messages=[USER]))]
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_parse_errors_map(stub: chat_pb2_grpc.AgentServiceAsyncStub, fake: FakeParse) -> None:
    fake.abort = (grpc.StatusCode.UNAVAILABLE, "no worker")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        [_ async for _ in stub.Chat(chat_pb2.ChatRequest(model="demo", messages=[USER]))]
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and info.value.details() == "no worker"


async def test_internal_abort_names_the_request(stub: chat_pb2_grpc.AgentServiceAsyncStub, fake: FakeParse) -> None:
    fake.abort = (grpc.StatusCode.INTERNAL, "KeyError: 'secret'")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        [_ async for _ in stub.Chat(chat_pb2.ChatRequest(request_id="r2", model="demo", messages=[USER]))]
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert info.value.details() == "internal error (request id: r2)"


async def test_in_band_errors_pass_through(stub: chat_pb2_grpc.AgentServiceAsyncStub, fake: FakeParse) -> None:
    fake.script = [batch(started()), batch(error(common_pb2.ERROR_CODE_INTERNAL, "boom"))]
    frames = [b async for b in stub.Chat(chat_pb2.ChatRequest(request_id="r1", model="demo", messages=[USER]))]
    # An internal error names the request, never what went wrong inside (that is logged with the same id).
    assert frames[-1].events[0].error.message == "internal error (request id: r1)"
    assert frames[-1].events[0].error.code == common_pb2.ERROR_CODE_INTERNAL


async def test_get_model(stub: chat_pb2_grpc.AgentServiceAsyncStub) -> None:
    info = await stub.GetModel(chat_pb2.ModelInfoRequest())
    assert (info.served_model_name, info.max_model_len) == ("demo", 4096)
