"""The router's gRPC face: places each Generate call and proxies the worker's stream."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import structlog
from opentelemetry import trace

from services.api import router_pb2, router_pb2_grpc, worker_pb2, worker_pb2_grpc
from services.common import errors
from services.common.grpc_util import open_channel
from services.common.tracing import Tracing
from services.router import convert
from services.router.policy import describe
from services.router.router import Router

log = structlog.get_logger()

# Failures that mean "this worker cannot take the request" rather than "the request is bad".
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})


class WorkerChannels:
    """One gRPC channel per worker address, opened on first use."""

    def __init__(self, tracing: Tracing | None) -> None:
        self._tracing = tracing
        self._channels: dict[str, grpc.aio.Channel] = {}

    def stub(self, address: str) -> worker_pb2_grpc.WorkerStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(address, self._tracing)
        return worker_pb2_grpc.WorkerStub(channel)

    async def close(self, address: str) -> None:
        channel = self._channels.pop(address, None)
        if channel is not None:
            await channel.close()

    async def close_all(self) -> None:
        for address in list(self._channels):
            await self.close(address)


class RouterServicer(router_pb2_grpc.RouterServicer):
    """Router.Generate: rank workers, stream from the best, fail over before the first token."""

    def __init__(self, router: Router, channels: WorkerChannels, max_retries: int, tracer: trace.Tracer) -> None:
        self._router = router
        self._channels = channels
        self._max_retries = max_retries
        self._tracer = tracer

    async def Generate(
        self,
        request: worker_pb2.GenerateRequest,
        context: grpc.aio.ServicerContext[worker_pb2.GenerateRequest, worker_pb2.GenerateResponse],
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        tried: set[str] = set()
        last_error: errors.MeshError = errors.UnavailableError("no worker is available")
        for _attempt in range(self._max_retries + 1):
            placement = self._router.place(request.token_ids, request.cache_salt, frozenset(tried))
            if not placement.candidates:
                break
            best = placement.candidates[0]
            endpoint = self._router.registry.get(best.worker_id)
            if endpoint is None:
                tried.add(best.worker_id)
                continue
            tried.add(best.worker_id)
            with self._tracer.start_as_current_span("router.route") as span:
                span.set_attributes({
                    "router.mode": self._router.policy.mode,
                    "router.worker_id": best.worker_id,
                    "router.overlap_blocks": best.overlap_blocks,
                    "router.request_blocks": placement.request_blocks,
                    "router.candidates": len(placement.candidates),
                    "session.id": request.identity.session_id,
                    "trajectory.id": request.identity.trajectory_id,
                })
            log.info("router.route_decided", request_id=request.request_id, worker_id=best.worker_id,
                     overlap_blocks=best.overlap_blocks, request_blocks=placement.request_blocks,
                     candidates=describe(placement.candidates))
            call = self._channels.stub(endpoint.address).Generate(request)
            started = False
            try:
                with self._router.in_flight(best.worker_id, placement.request_blocks, best.new_blocks):
                    async for frame in call:
                        if not started:
                            started = True
                            if frame.HasField("prompt") and not frame.prompt.worker_id:
                                frame.prompt.worker_id = best.worker_id
                        yield frame
                return
            except grpc.aio.AioRpcError as exc:
                err = errors.from_rpc_error(exc)
                if started:
                    log.warning("router.worker_failed_mid_stream", worker_id=best.worker_id, error=err.message)
                    yield worker_pb2.GenerateResponse(error=errors.to_proto(err))
                    return
                if exc.code() not in RETRYABLE:
                    await errors.abort_with(context, err)
                    return
                log.warning("router.worker_failed_retrying", worker_id=best.worker_id, error=err.message)
                last_error = errors.UnavailableError(f"worker {best.worker_id} failed: {err.message}")
            finally:
                call.cancel()
        await errors.abort_with(context, last_error)

    async def ListWorkers(
        self,
        request: router_pb2.ListWorkersRequest,
        context: grpc.aio.ServicerContext[router_pb2.ListWorkersRequest, router_pb2.ListWorkersResponse],
    ) -> router_pb2.ListWorkersResponse:
        return router_pb2.ListWorkersResponse(
            workers=[convert.worker_info(ep) for ep in self._router.registry.endpoints()]
        )
