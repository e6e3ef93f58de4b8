"""The mux transport (``services.common.mux``): many streams on one gRPC session per peer, as a real
grpc.aio server and client on loopback, with handlers shaped like the servicers'."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from services.api import common_pb2, worker_pb2
from services.common import errors, mux
from services.common.grpc_util import GrpcServer, open_mux_channel
from services.launcher.supervisor import free_port

pytestmark = pytest.mark.timeout(30)

GENERATE = mux.method_name("Worker", "Generate")


class Handlers:
    """A Generate handler scripted by the request: ``max_tokens`` frames of one token each, and the
    behaviours the tests name in ``request_id``."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.metadata: list[dict[str, str]] = []

    async def generate(
        self, request: worker_pb2.GenerateRequest, context: Any
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        self.metadata.append(dict(context.invocation_metadata()))
        kind = request.request_id.split("-")[0]
        try:
            if kind == "reject":
                await errors.abort_with(context, errors.InvalidRequestError("bad prompt", param="messages"))
            if kind == "crash":
                raise RuntimeError("boom")
            for n in range(request.sampling.max_tokens):
                if kind == "hang" and n == 1:
                    self.started.set()
                    await self.release.wait()
                yield worker_pb2.GenerateResponse(token_ids=[n])
                await asyncio.sleep(0)
            yield worker_pb2.GenerateResponse(finish_reason=common_pb2.FINISH_REASON_LENGTH)
        except asyncio.CancelledError:
            self.cancelled.append(request.request_id)
            raise


@pytest.fixture
async def peer() -> AsyncIterator[tuple[Handlers, GrpcServer, mux.GenerateStub]]:
    handlers = Handlers()
    server = GrpcServer(None, "127.0.0.1", 0)
    server.add_mux({GENERATE: mux.MuxMethod(handlers.generate, worker_pb2.GenerateRequest)})
    await server.start()
    channel = open_mux_channel(server.address)
    try:
        yield handlers, server, mux.GenerateStub(channel, "Worker")
    finally:
        await channel.close()
        await server.stop(0)


def request(request_id: str, tokens: int) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(request_id=request_id, sampling=common_pb2.SamplingParams(max_tokens=tokens))


async def collect(call: mux.MuxCall[worker_pb2.GenerateResponse]) -> list[int]:
    tokens: list[int] = []
    async for frame in call:
        tokens.extend(frame.token_ids)
    return tokens


async def test_many_concurrent_streams_each_get_their_own_frames_in_order(peer: Any) -> None:
    _, _, stub = peer
    sizes = [1, 5, 40, 17, 64, 3, 0, 9]
    results = await asyncio.gather(*(collect(stub.Generate(request(f"ok-{i}", n))) for i, n in enumerate(sizes)))
    assert results == [list(range(n)) for n in sizes]


async def test_streams_share_one_session(peer: Any) -> None:
    _, _, stub = peer
    await collect(stub.Generate(request("ok-a", 3)))
    session = stub.channel._session
    await asyncio.gather(*(collect(stub.Generate(request(f"ok-{i}", 3))) for i in range(5)))
    assert stub.channel._session is session and session is not None and not session.closed


async def test_abort_before_the_first_frame_is_the_status_with_its_param(peer: Any) -> None:
    _, _, stub = peer
    call = stub.Generate(request("reject-1", 3))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and info.value.details() == "bad prompt"
    err = errors.from_rpc_error(info.value)
    assert isinstance(err, errors.InvalidRequestError) and err.param == "messages"
    assert await collect(stub.Generate(request("ok-after", 2))) == [0, 1]  # the session is unharmed


async def test_a_handler_that_raises_ends_its_stream_unknown_and_no_other(peer: Any) -> None:
    _, _, stub = peer
    ok = asyncio.create_task(collect(stub.Generate(request("ok-x", 30))))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collect(stub.Generate(request("crash-1", 3)))
    assert info.value.code() == grpc.StatusCode.UNKNOWN and "boom" in (info.value.details() or "")
    assert await ok == list(range(30))


async def test_cancel_reaches_the_handler_and_frees_the_stream(peer: Any) -> None:
    handlers, _, stub = peer
    call = stub.Generate(request("hang-1", 5))
    assert list((await call.read()).token_ids) == [0]
    await handlers.started.wait()
    assert call.cancel() and not call.cancel()
    for _ in range(100):
        if handlers.cancelled:
            break
        await asyncio.sleep(0.01)
    assert handlers.cancelled == ["hang-1"]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.CANCELLED


async def test_timeout_is_deadline_exceeded_and_cancels_the_handler(peer: Any) -> None:
    handlers, _, stub = peer
    call = stub.Generate(request("hang-2", 5), timeout=0.2)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collect(call)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    for _ in range(100):
        if handlers.cancelled:
            break
        await asyncio.sleep(0.01)
    assert handlers.cancelled == ["hang-2"]


async def test_unknown_method_is_unimplemented(peer: Any) -> None:
    _, _, stub = peer
    call = stub.channel.open("/harnessmesh.v1.Nope/Generate", request("ok-1", 1),
                             worker_pb2.GenerateResponse.FromString)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_peer_gone_fails_open_streams_unavailable_and_the_next_stream_reconnects() -> None:
    handlers = Handlers()
    server = GrpcServer(None, "127.0.0.1", 0)
    server.add_mux({GENERATE: mux.MuxMethod(handlers.generate, worker_pb2.GenerateRequest)})
    await server.start()
    channel = open_mux_channel(server.address)
    stub = mux.GenerateStub(channel, "Worker")
    try:
        call = stub.Generate(request("hang-3", 5))
        assert list((await call.read()).token_ids) == [0]
        await handlers.started.wait()
        await server.stop(0)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await collect(call)
        assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        restarted = GrpcServer(None, "127.0.0.1", server.port)
        restarted.add_mux({GENERATE: mux.MuxMethod(Handlers().generate, worker_pb2.GenerateRequest)})
        await restarted.start()
        try:
            assert await collect(stub.Generate(request("ok-again", 4))) == [0, 1, 2, 3]
        finally:
            await restarted.stop(0)
    finally:
        await channel.close()


async def test_unreachable_peer_fails_fast_unavailable() -> None:
    channel = open_mux_channel(f"127.0.0.1:{free_port()}")  # nothing listens there
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await collect(mux.GenerateStub(channel, "Worker").Generate(request("ok-1", 1), timeout=5))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await channel.close()


async def test_each_stream_carries_the_callers_trace_context(peer: Any) -> None:
    handlers, _, stub = peer
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("caller") as span:
        trace_id = span.get_span_context().trace_id
        await collect(stub.Generate(request("ok-t", 1)))
    await collect(stub.Generate(request("ok-u", 1)))  # no span around this one
    carried = TraceContextTextMapPropagator().extract(handlers.metadata[0])
    assert trace.get_current_span(carried).get_span_context().trace_id == trace_id
    assert "traceparent" not in handlers.metadata[1]


async def test_a_busy_session_batches_frames_of_many_streams_per_message(peer: Any) -> None:
    _, _, stub = peer
    results = await asyncio.gather(*(collect(stub.Generate(request(f"ok-{i}", 50))) for i in range(16)))
    assert results == [list(range(50))] * 16
    session = stub.channel._session
    assert session is not None
    # 16 streams x 51 messages arrived; the reader saw far fewer gRPC messages than that.
    assert session.batches_read < 16 * 51 / 2


async def test_linger_spaces_plain_frames_but_never_delays_a_first_frame_or_an_end() -> None:
    linger = 0.2  # long enough that "went at once" and "waited for the next batch" cannot be confused
    handlers = Handlers()
    server = GrpcServer(None, "127.0.0.1", 0)
    server.add_mux({GENERATE: mux.MuxMethod(handlers.generate, worker_pb2.GenerateRequest)}, linger=linger)
    await server.start()
    channel = open_mux_channel(server.address)
    try:
        stub = mux.GenerateStub(channel, "Worker")
        loop = asyncio.get_running_loop()
        started = loop.time()
        call = stub.Generate(request("ok-1", 8))
        assert list((await call.read()).token_ids) == [0]
        assert loop.time() - started < 0.75 * linger  # a stream's first frame goes at once
        assert await collect(call) == list(range(1, 8))
        # this handler yields one token per read (an engine's buffer would merge them): each later
        # frame waited for the session's next batch, ``linger`` after the previous one
        assert loop.time() - started >= 7 * linger * 0.9
        started = loop.time()
        assert await collect(stub.Generate(request("ok-2", 0))) == []  # first message and end: no wait
        assert loop.time() - started < 0.75 * linger
    finally:
        await channel.close()
        await server.stop(0)


async def test_heartbeats_keep_a_slow_stream_alive_past_the_liveness_window() -> None:
    async def slow(request: worker_pb2.GenerateRequest, context: Any) -> AsyncIterator[worker_pb2.GenerateResponse]:
        await asyncio.sleep(mux.LIVENESS * 2.5)  # queued behind a long prefill: silent, but alive
        yield worker_pb2.GenerateResponse(token_ids=[7])

    server = GrpcServer(None, "127.0.0.1", 0)
    server.add_mux({GENERATE: mux.MuxMethod(slow, worker_pb2.GenerateRequest)})
    await server.start()
    channel = open_mux_channel(server.address)
    try:
        assert await collect(mux.GenerateStub(channel, "Worker").Generate(request("slow", 1))) == [7]
        assert channel._session is not None and channel._session.batches_read >= 4  # heartbeats came
    finally:
        await channel.close()
        await server.stop(0)


async def test_stopping_with_grace_finishes_open_streams_and_refuses_new_ones_unavailable(peer: Any) -> None:
    """A draining server (``GrpcServer.stop(grace)``: a worker told to stop) lets its open streams run to
    their end, answers a stream opened meanwhile UNAVAILABLE before any frame (the router then goes
    elsewhere), and stops as soon as nothing is open rather than after the whole grace."""
    handlers, server, stub = peer
    open_call = stub.Generate(request("hang-1", 4))
    assert list((await open_call.read()).token_ids) == [0]
    await handlers.started.wait()
    loop = asyncio.get_running_loop()
    started = loop.time()
    stopping = asyncio.create_task(server.stop(20.0))
    await asyncio.sleep(0.05)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collect(stub.Generate(request("late", 2)))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert not stopping.done()  # the open stream holds the stop
    handlers.release.set()
    assert await collect(open_call) == [1, 2, 3]  # the rest of it, to the end
    await asyncio.wait_for(stopping, 10)
    assert loop.time() - started < 10  # done when the stream was, not after the grace
    assert handlers.cancelled == []
