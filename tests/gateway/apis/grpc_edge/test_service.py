"""The AgentService gRPC edge: validated pass-through with the mesh's error mapping."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from structlog.testing import capture_logs

from gateway.server import Gateway
from services.api import chat_pb2, chat_pb2_grpc, common_pb2
from services.common import errors
from tests.gateway.fake_parse import FakeParse, batch, error, finish, started, text, usage

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


async def test_get_model(stub: chat_pb2_grpc.AgentServiceAsyncStub, fake: FakeParse) -> None:
    fake.model.accepts_messages_base = True
    info = await stub.GetModel(chat_pb2.ModelInfoRequest())
    assert (info.served_model_name, info.max_model_len) == ("demo", 4096)
    assert not info.accepts_messages_base  # between gateway and parse only


async def test_one_access_line_per_chat_call(stub: chat_pb2_grpc.AgentServiceAsyncStub, fake: FakeParse) -> None:
    fake.script = [batch(started(), text("secret answer")), batch(finish(), usage(900, 5, 512))]
    identity = common_pb2.Identity(session_id="S", trajectory_id="T")
    with capture_logs() as logs:
        [_ async for _ in stub.Chat(chat_pb2.ChatRequest(request_id="g1", model="demo", messages=[USER],
                                                         identity=identity))]
        with pytest.raises(grpc.aio.AioRpcError):
            [_ async for _ in stub.Chat(chat_pb2.ChatRequest(request_id="g2", model="demo"))]
    lines = [e for e in logs if e["event"] == "gateway.access"]
    assert [(e["method"], e["path"], e["status"], e["request_id"]) for e in lines] == [
        ("grpc", "/harnessmesh.v1.AgentService/Chat", "OK", "g1"),
        ("grpc", "/harnessmesh.v1.AgentService/Chat", "INVALID_ARGUMENT", "g2")]
    ok = lines[0]
    assert (ok["session_id"], ok["trajectory_id"]) == ("S", "T")
    assert (ok["prompt_tokens"], ok["completion_tokens"], ok["cached_tokens"]) == (900, 5, 512)
    assert ok["duration_ms"] > 0 and "secret answer" not in repr(lines)


async def test_a_session_is_closed_by_its_hint_or_dynamos_header(stub: chat_pb2_grpc.AgentServiceAsyncStub,
                                                                 fake: FakeParse) -> None:
    fake.script = [batch(started(), text("bye")), batch(finish())]
    request = chat_pb2.ChatRequest(model="demo", messages=[USER])
    [_ async for _ in stub.Chat(request)]
    [_ async for _ in stub.Chat(request, metadata=(("x-dynamo-session-final", "true"),))]
    request.hints.session_final = True
    [_ async for _ in stub.Chat(request)]
    assert [r.hints.session_final for r in fake.requests] == [False, True, True]
