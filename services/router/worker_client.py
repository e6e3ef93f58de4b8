"""gRPC side of the router's worker connections: channels, Generate streams, and the KvRecovery client."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from services.api import kv_pb2, kv_pb2_grpc, worker_pb2, worker_pb2_grpc
from services.common import errors, mux
from services.common.grpc_util import drain, open_channel, open_mux_channel
from services.common.prompt_reuse import ReusingCall, ReusingStub
from services.common.tls import PLAINTEXT, TlsFiles
from services.common.tracing import Tracing
from services.router import convert
from services.router.index import KvEvent
from services.router.proxy import RequestRejected, WorkerFailure
from services.router.recovery import Dump
from services.router.registry import WorkerEndpoint
from services.router.stream import AttemptRequest, Frame

# Statuses that mean "this worker cannot go on" rather than "the request is bad".
WORKER_FAILURES = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED,
    grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
})


class WorkerChannels:
    """Per worker address, opened on first use: a gRPC channel for unary calls and a mux channel for
    Generate streams."""

    def __init__(self, tracing: Tracing | None, tls: TlsFiles = PLAINTEXT) -> None:
        self._tracing = tracing
        self._tls = tls
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._streams: dict[str, mux.MuxChannel] = {}
        self._stubs: dict[str, ReusingStub] = {}

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(address, self._tracing, self._tls)
        return channel

    def streams(self, address: str) -> mux.MuxChannel:
        streams = self._streams.get(address)
        if streams is None:
            streams = self._streams[address] = open_mux_channel(address, self._tls)
        return streams

    def generate_stub(self, address: str) -> ReusingStub:
        """``Worker.Generate`` streams on the worker's mux, a session's prompts sent as tails when they can."""
        stub = self._stubs.get(address)
        if stub is None:
            stub = self._stubs[address] = ReusingStub(mux.GenerateStub(self.streams(address), "Worker"))
        return stub

    def stub(self, address: str) -> worker_pb2_grpc.WorkerStub:
        return worker_pb2_grpc.WorkerStub(self.channel(address))

    async def close(self, address: str) -> None:
        channel = self._channels.pop(address, None)
        if channel is not None:
            await channel.close()
        self._stubs.pop(address, None)
        streams = self._streams.pop(address, None)
        if streams is not None:
            await streams.close()

    async def close_all(self) -> None:
        for address in list(self._channels.keys() | self._streams.keys()):
            await self.close(address)


class GrpcWorkerStream:
    """:class:`services.router.proxy.WorkerStream` over one ``Worker.Generate`` stream (on the worker's mux)."""

    def __init__(self, call: ReusingCall) -> None:
        self._call = call

    async def read(self) -> Frame | None:
        try:
            response = await self._call.read()
        except grpc.aio.AioRpcError as exc:
            err = errors.from_rpc_error(exc)
            if exc.code() in WORKER_FAILURES:
                raise WorkerFailure(err.message) from None
            raise RequestRejected(err) from None
        if response is grpc.aio.EOF:
            return None
        assert isinstance(response, worker_pb2.GenerateResponse)
        return convert.frame(response)

    async def drain(self) -> None:
        await drain(self._call)

    def cancel(self) -> None:
        self._call.cancel()


class GrpcWorkerStreams:
    """:class:`services.router.proxy.WorkerStreams` for one client request: each attempt is that request
    (``convert.worker_request``) on the worker's channel."""

    def __init__(self, channels: WorkerChannels, request: worker_pb2.GenerateRequest) -> None:
        self._channels = channels
        self._request = request

    def open(self, endpoint: WorkerEndpoint, attempt: AttemptRequest) -> GrpcWorkerStream:
        request = convert.worker_request(self._request, attempt)
        stub = self._channels.generate_stub(endpoint.address)
        return GrpcWorkerStream(stub.Generate(request, prompt=attempt.tokens, key=request.prompt_key))


class GrpcRecoverySource:
    """:class:`services.router.recovery.RecoverySource` over the workers' ``KvRecovery`` service."""

    def __init__(self, channels: WorkerChannels, timeout: float = 5.0) -> None:
        self._channels = channels
        self._timeout = timeout

    async def replay(self, endpoint: WorkerEndpoint, from_event_id: int) -> Sequence[KvEvent] | None:
        stub = kv_pb2_grpc.KvRecoveryStub(self._channels.channel(endpoint.address))
        reply = await stub.Replay(kv_pb2.KvReplayRequest(from_event_id=from_event_id), timeout=self._timeout)
        return convert.kv_events(reply.batch) if reply.complete else None

    async def dump(self, endpoint: WorkerEndpoint) -> Dump:
        stub = kv_pb2_grpc.KvRecoveryStub(self._channels.channel(endpoint.address))
        reply = await stub.Dump(kv_pb2.KvDumpRequest(), timeout=self._timeout)
        parents = [p if has else None for p, has in zip(reply.parent_hashes, reply.has_parent, strict=True)] \
            if reply.chained else None
        return Dump(reply.last_event_id, list(reply.block_hashes), parents)
