"""The router's gRPC face: admits, places and proxies each Generate call; retries and migrates.

* Admission: while every worker is saturated, requests wait in a priority queue (``admission.py``).
* Before the first frame a failing worker is replaced by the next-best one (``max_retries``).
* After it the request **migrates**: the next-best worker gets the prompt plus the tokens so far and the
  stream goes on (``migration_limit`` times; then, or with 0, the client gets an in-band error).
* A worker silent for ``stall_timeout`` seconds mid-request leaves the registry and index (it rejoins
  with its next heartbeat and a fresh dump) and its request migrates; so do the requests of a worker
  whose heartbeats stop (:meth:`RouterServicer.worker_gone`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import structlog
from opentelemetry import trace

from services.api import common_pb2, router_pb2, router_pb2_grpc, worker_pb2
from services.common import errors
from services.common.grpc_util import drain
from services.router import convert
from services.router.admission import AdmissionQueue
from services.router.metrics import RouterMetrics, decision_reason
from services.router.policy import Candidate, describe
from services.router.router import Placement, Router
from services.router.stream import StreamProgress
from services.router.worker_client import WorkerChannels

log = structlog.get_logger()

# Failures that mean "this worker cannot go on" rather than "the request is bad".
WORKER_FAILURES = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED,
    grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
})
INBAND_WORKER_FAILURES = frozenset({common_pb2.ERROR_CODE_UNAVAILABLE, common_pb2.ERROR_CODE_INTERNAL})


@dataclass(frozen=True)
class ProxyLimits:
    """How hard the router tries before giving a client an error."""

    max_retries: int = 2            # other workers tried when one fails before its first frame
    migration_limit: int = 3        # migrations after the first frame (0: none)
    stall_timeout: float = 30.0     # seconds without a frame before a worker counts as stalled


class _WorkerFailed(Exception):
    def __init__(self, message: str, status: grpc.StatusCode | None = None, error: errors.MeshError | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.error = error


class _Attempt:
    """One worker call of one request; ``abandon`` ends it from outside (worker gone)."""

    def __init__(self, worker_id: str, call: grpc.aio.UnaryStreamCall[worker_pb2.GenerateRequest,
                                                                     worker_pb2.GenerateResponse]) -> None:
        self.worker_id = worker_id
        self.call = call
        self.abandoned = False

    def abandon(self) -> None:
        self.abandoned = True
        self.call.cancel()


class RouterServicer(router_pb2_grpc.RouterServicer):
    """Router.Generate and Router.ListWorkers (see module docstring)."""

    def __init__(
        self, router: Router, channels: WorkerChannels, limits: ProxyLimits, tracer: trace.Tracer,
        admission: AdmissionQueue | None = None, metrics: RouterMetrics | None = None,
    ) -> None:
        self.metrics = metrics or RouterMetrics()
        self._router = router
        self._channels = channels
        self._limits = limits
        self._tracer = tracer
        self._admission = admission if admission is not None else AdmissionQueue(router.all_saturated)
        self._attempts: dict[str, set[_Attempt]] = {}

    def worker_gone(self, worker_id: str) -> None:
        """Migrate every request running on a worker that stopped heartbeating."""
        for attempt in list(self._attempts.get(worker_id, ())):
            attempt.abandon()

    async def Generate(
        self,
        request: worker_pb2.GenerateRequest,
        context: grpc.aio.ServicerContext[worker_pb2.GenerateRequest, worker_pb2.GenerateResponse],
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        progress = StreamProgress(request)
        try:
            async for frame in self._generate(request, progress):
                yield frame
        except errors.MeshError as err:
            if not progress.sent_any:
                await errors.abort_with(context, err)
                return
            yield worker_pb2.GenerateResponse(error=errors.to_proto(err))

    async def _generate(
        self, request: worker_pb2.GenerateRequest, progress: StreamProgress
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        arrived = time.monotonic()
        settle = await self._admission.admit(request.hints.priority)
        queue_wait = time.monotonic() - arrived
        self.metrics.queue_wait.observe(queue_wait)
        tried: set[str] = set()
        retries = migrations = 0
        try:
            while True:
                placement = self._router.place(
                    [*request.token_ids, *progress.generated], request.cache_salt, frozenset(tried),
                    osl=request.hints.osl, prefer="" if tried else request.target_worker_id)
                endpoint = self._router.registry.get(placement.candidates[0].worker_id) \
                    if placement.candidates else None
                if endpoint is None:
                    raise errors.UnavailableError("no worker is available" if not tried else
                                                  f"no worker left to take the request (tried {sorted(tried)})")
                best = placement.candidates[0]
                route = self._route_span(request, placement, best, queue_wait, retry=bool(tried),
                                         migrating=progress.sent_any)
                tried.add(best.worker_id)
                with trace.use_span(route, end_on_exit=False):  # the worker call is the route span's child
                    attempt = _Attempt(best.worker_id, self._channels.stub(endpoint.address).Generate(
                        progress.worker_request()))
                inflight = self._router.begin(best.worker_id, placement, best)
                if settle:
                    self._admission.settled()
                    settle = False
                self._attempts.setdefault(best.worker_id, set()).add(attempt)
                try:
                    first = True
                    async for frame in self._frames(attempt):
                        if first:
                            inflight.prefill_done()
                            route.add_event("first_frame")
                            first = False
                        out = progress.absorb(frame, best.worker_id)
                        if out is not None:
                            yield out
                        if frame.finish_reason or frame.HasField("error"):
                            await drain(attempt.call)
                            return
                    raise _WorkerFailed("the worker's stream ended without a finish frame")
                except _WorkerFailed as failure:
                    route.set_status(trace.StatusCode.ERROR, failure.message)
                    if failure.status is not None and failure.status not in WORKER_FAILURES:
                        raise failure.error or errors.InternalError(failure.message) from None
                    if not progress.sent_any:
                        retries += 1
                        if retries > self._limits.max_retries:
                            raise errors.UnavailableError(f"worker {best.worker_id} failed: {failure.message}") \
                                from None
                        log.warning("router.worker_failed_retrying", request_id=request.request_id,
                                    worker_id=best.worker_id, error=failure.message)
                        continue
                    final = progress.finished_early()
                    if final is not None:
                        yield final
                        return
                    migrations += 1
                    if migrations > self._limits.migration_limit:
                        log.warning("router.migration_exhausted", request_id=request.request_id,
                                    worker_id=best.worker_id, migrations=migrations - 1)
                        raise errors.UnavailableError(
                            f"worker {best.worker_id} failed mid-stream ({failure.message}); "
                            f"migration limit {self._limits.migration_limit} reached") from None
                    log.warning("router.request_migrating", request_id=request.request_id,
                                worker_id=best.worker_id, tokens_so_far=len(progress.generated),
                                error=failure.message)
                finally:
                    route.end()
                    attempt.call.cancel()
                    inflight.release()
                    self._attempts.get(best.worker_id, set()).discard(attempt)
                    self._admission.pump()
        finally:
            if settle:
                self._admission.settled()

    async def _frames(self, attempt: _Attempt) -> AsyncIterator[worker_pb2.GenerateResponse]:
        """The worker's frames; worker failures (error, stall, gone) become :class:`_WorkerFailed`."""
        while True:
            try:
                # asyncio.timeout, not wait_for: no Task per frame on the hot path.
                async with asyncio.timeout(self._limits.stall_timeout):
                    frame = await attempt.call.read()
            except TimeoutError:
                gone = self._router.forget(attempt.worker_id)
                log.warning("router.worker_stalled", worker_id=attempt.worker_id, forgotten=gone is not None,
                            timeout=self._limits.stall_timeout)
                raise _WorkerFailed(f"no frame for {self._limits.stall_timeout}s") from None
            except asyncio.CancelledError:
                if attempt.abandoned:
                    raise _WorkerFailed("the worker left the mesh") from None
                raise
            except grpc.aio.AioRpcError as exc:
                if attempt.abandoned:
                    raise _WorkerFailed("the worker left the mesh") from None
                err = errors.from_rpc_error(exc)
                raise _WorkerFailed(err.message, exc.code(), err) from None
            if frame is grpc.aio.EOF:
                return
            assert isinstance(frame, worker_pb2.GenerateResponse)
            if frame.HasField("error") and frame.error.code in INBAND_WORKER_FAILURES:
                raise _WorkerFailed(frame.error.message)
            yield frame

    def _route_span(self, request: worker_pb2.GenerateRequest, placement: Placement, best: Candidate,
                    queue_wait: float, *, retry: bool, migrating: bool) -> trace.Span:
        """Log the decision and start the ``router.route`` span (ended by the caller with the attempt)."""
        mode = self._router.policy.mode
        reason = decision_reason(mode, best.overlap_blocks, len(placement.candidates),
                                 target=bool(request.target_worker_id) and best.worker_id == request.target_worker_id,
                                 retry=retry and not migrating, migration=migrating)
        self.metrics.decisions.labels(mode, reason).inc()
        shown = placement.candidates[:16]
        span = self._tracer.start_span("router.route", attributes={
            "router.mode": mode,
            "router.reason": reason,
            "router.worker_id": best.worker_id,
            "router.overlap_blocks": best.overlap_blocks,
            "router.new_blocks": best.new_blocks,
            "router.request_blocks": placement.request_blocks,
            "router.candidates": len(placement.candidates),
            "router.candidate.workers": [c.worker_id for c in shown],
            "router.candidate.overlap_blocks": [c.overlap_blocks for c in shown],
            "router.candidate.costs": [float(c.cost) for c in shown],
            "router.queue_wait_ms": round(queue_wait * 1000, 3),
            "router.migration": migrating,
            "router.prefill_only": request.prefill_only,
            "request.id": request.request_id,
        })
        log.info("router.route_decided", request_id=request.request_id, worker_id=best.worker_id, mode=mode,
                 reason=reason, overlap_blocks=best.overlap_blocks, request_blocks=placement.request_blocks,
                 priority=request.hints.priority, prefill_only=request.prefill_only,
                 queue_wait_ms=round(queue_wait * 1000, 3), candidates=describe(placement.candidates[:4]))
        return span

    async def ListWorkers(
        self,
        request: router_pb2.ListWorkersRequest,
        context: grpc.aio.ServicerContext[router_pb2.ListWorkersRequest, router_pb2.ListWorkersResponse],
    ) -> router_pb2.ListWorkersResponse:
        return router_pb2.ListWorkersResponse(
            workers=[convert.worker_info(ep) for ep in self._router.registry.endpoints()]
        )
