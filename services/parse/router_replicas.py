"""Several router replicas behind one Generate stub: the parse service fails over between them.

``--router-address`` may list replicas (``host:port,host:port``; each consumes the same KV events and
places on the same workers). Each stream goes to the first replica not marked down, in the order given
(the first is preferred, so one replica's prefix caches stay warm). A replica whose stream fails
``UNAVAILABLE`` is marked down for ``down_for`` seconds; the caller's retry before the first frame
(:class:`~services.common.prompt_reuse.ReusingCall`) or resume after it
(:class:`~services.parse.router_stream.ResumingRouterStream`) then opens the stream on the next one. With
every replica down the preferred one is tried (it may be back). ``ListWorkers`` (readiness) asks the
replicas in the same order and answers with the first that responds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import grpc

from services.api import router_pb2, router_pb2_grpc, worker_pb2
from services.common.mux import GenerateStub, MuxCall
from services.common.prompt_reuse import WrappedCall

DOWN_FOR = 2.0


class RouterReplicas:
    """``Generate`` over the replicas' mux stubs, in preference order (see module docstring)."""

    def __init__(self, stubs: Sequence[GenerateStub], *, down_for: float = DOWN_FOR) -> None:
        if not stubs:
            raise ValueError("at least one router replica is needed")
        self.stubs = list(stubs)
        self.down_for = down_for
        self._down_until = [0.0] * len(stubs)
        self.failovers = 0  # streams that went to a replica other than the preferred one

    def pick(self) -> int:
        now = time.monotonic()
        for i, until in enumerate(self._down_until):
            if until <= now:
                if i:
                    self.failovers += 1
                return i
        return 0

    def mark_down(self, index: int) -> None:
        self._down_until[index] = time.monotonic() + self.down_for

    def Generate(self, request: worker_pb2.GenerateRequest, *, timeout: float | None = None) -> ReplicaCall:
        index = self.pick()
        return ReplicaCall(self, index, self.stubs[index].Generate(request, timeout=timeout))


class ReplicaCall(WrappedCall):
    """One stream on one replica, read like a ``MuxCall``; an ``UNAVAILABLE`` marks its replica down."""

    def __init__(self, replicas: RouterReplicas, index: int, call: MuxCall[worker_pb2.GenerateResponse]) -> None:
        self._replicas = replicas
        self._index = index
        self._call = call

    async def read(self) -> worker_pb2.GenerateResponse | Any:
        try:
            return await self._call.read()
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                self._replicas.mark_down(self._index)
            raise



class RouterInfo:
    """The routers' unary ``ListWorkers``, answered by the first replica that responds (readiness)."""

    def __init__(self, stubs: Sequence[router_pb2_grpc.RouterStub]) -> None:
        self.stubs = list(stubs)

    async def ListWorkers(self, request: router_pb2.ListWorkersRequest, *, timeout: float | None = None,
                          ) -> router_pb2.ListWorkersResponse:
        error: grpc.aio.AioRpcError | None = None
        for stub in self.stubs:
            try:
                reply: router_pb2.ListWorkersResponse = await stub.ListWorkers(request, timeout=timeout)
                return reply
            except grpc.aio.AioRpcError as exc:
                error = exc
        assert error is not None
        raise error
