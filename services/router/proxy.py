"""Runs one request across workers: admit, place, stream; retry, migrate or fail.

* Admission: while every worker is saturated, requests wait in a priority queue (``admission.py``).
* Before the first frame a failing worker is replaced by the next-best one (``max_retries``).
* After it the request **migrates**: the next-best worker gets the prompt plus the tokens so far and the
  stream goes on (``migration_limit`` times; then, or with 0, the client gets an error).
* A worker that sends no first frame in time (``first_frame.py``: its recent first frames, or
  ``first_frame_timeout``) loses the request to the next-best worker, like a failure before the first frame.
* A worker silent for ``stall_timeout`` seconds mid-request leaves the registry and index (it rejoins
  with its next heartbeat and a fresh dump) and its request migrates; so do the requests of a worker
  whose heartbeats stop (:meth:`Proxy.worker_gone`).

Workers are reached through :class:`WorkerStreams` (gRPC in the router process, a fake in tests): frames
arrive as :class:`~services.router.stream.Frame` values and transport failures as :class:`WorkerFailure`
("this worker cannot go on": try another) or :class:`RequestRejected` ("the request is bad": no other
worker would do better). No gRPC or protobuf here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import structlog
from opentelemetry import trace

from services.common import errors
from services.router.admission import AdmissionQueue
from services.router.first_frame import FirstFrameDeadlines
from services.router.metrics import RouterMetrics, decision_reason
from services.router.policy import Candidate, describe
from services.router.registry import WorkerEndpoint
from services.router.router import Placement, Router
from services.router.stream import AttemptRequest, Frame, ProxyRequest, StreamProgress

log = structlog.get_logger()

# In-band errors that mean "this worker cannot go on" rather than "the request is bad".
WORKER_ERRORS: tuple[type[errors.MeshError], ...] = (errors.UnavailableError, errors.InternalError)


@dataclass(frozen=True)
class ProxyLimits:
    """How hard the router tries before giving a client an error."""

    max_retries: int = 2            # other workers tried when one fails before its first frame
    migration_limit: int = 3        # migrations after the first frame (0: none)
    stall_timeout: float = 30.0     # seconds without a frame before a worker counts as stalled
    first_frame_timeout: float = 0.0  # seconds to the first frame (0: derived per worker, first_frame.py)


class WorkerFailure(Exception):
    """The worker cannot go on with this request (unreachable, overloaded, cancelled, stalled, gone)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class RequestRejected(Exception):
    """The worker refused the request itself; ``error`` goes to the client as it is."""

    def __init__(self, error: errors.MeshError) -> None:
        super().__init__(error.message)
        self.error = error


class WorkerStream(Protocol):
    """One attempt's stream from one worker."""

    async def read(self) -> Frame | None:
        """The next frame; None at the end of the stream. Raises :class:`WorkerFailure` or
        :class:`RequestRejected`; after :meth:`cancel`, may raise :class:`asyncio.CancelledError`."""
        ...

    async def drain(self) -> None:
        """Read what follows the final frame up to the end of the stream (never raises)."""
        ...

    def cancel(self) -> None:
        """End the attempt (no-op once the stream has ended); a pending :meth:`read` fails."""
        ...


class WorkerStreams(Protocol):
    """Opens attempts of one request on workers."""

    def open(self, endpoint: WorkerEndpoint, attempt: AttemptRequest) -> WorkerStream:
        """Start ``attempt`` on ``endpoint`` (called inside the attempt's ``router.route`` span)."""
        ...


class _Attempt:
    """One worker stream of one request; ``abandon`` ends it from outside (worker gone)."""

    def __init__(self, worker_id: str, stream: WorkerStream) -> None:
        self.worker_id = worker_id
        self.stream = stream
        self.abandoned = False

    def abandon(self) -> None:
        self.abandoned = True
        self.stream.cancel()


class Proxy:
    """Admits, places and streams requests; decides retry, migration or failure (see module docstring).

    :meth:`run` yields the client's frames; the client's errors are raised as
    :class:`~services.common.errors.MeshError` (the caller decides between a status and an in-band error).
    """

    def __init__(
        self, router: Router, limits: ProxyLimits, *, admission: AdmissionQueue | None = None,
        tracer: trace.Tracer | None = None, metrics: RouterMetrics | None = None,
    ) -> None:
        self.router = router
        self.limits = limits
        self.admission = admission if admission is not None else AdmissionQueue(router.all_saturated)
        self.metrics = metrics or RouterMetrics()
        self._tracer = tracer or trace.get_tracer("harnessmesh.router")
        self._attempts: dict[str, set[_Attempt]] = {}
        self.first_frames = FirstFrameDeadlines(limits.first_frame_timeout)

    def worker_gone(self, worker_id: str) -> None:
        """Migrate every request running on a worker that stopped heartbeating."""
        for attempt in list(self._attempts.get(worker_id, ())):
            attempt.abandon()

    async def run(self, request: ProxyRequest, workers: WorkerStreams) -> AsyncIterator[Frame]:
        """The client's stream for ``request``: one uninterrupted response whatever happens behind it."""
        progress = StreamProgress(request)
        arrived = time.monotonic()
        settle = await self.admission.admit(request.priority)
        queue_wait = time.monotonic() - arrived
        self.metrics.queue_wait.observe(queue_wait)
        tried: set[str] = set()
        retries = migrations = 0
        try:
            while True:
                placement = self.router.place(
                    progress.tokens_so_far(), request.cache_salt, frozenset(tried),
                    osl=request.osl, prefer="" if tried else request.target_worker_id, session=request.session)
                endpoint = self.router.registry.get(placement.candidates[0].worker_id) \
                    if placement.candidates else None
                if endpoint is None:
                    raise errors.UnavailableError("no worker is available" if not tried else
                                                  f"no worker left to take the request (tried {sorted(tried)})")
                best = placement.candidates[0]
                route = self._route_span(request, placement, best, queue_wait, retry=bool(tried),
                                         migrating=progress.sent_any)
                tried.add(best.worker_id)
                with trace.use_span(route, end_on_exit=False):  # the worker call is the route span's child
                    attempt = _Attempt(best.worker_id, workers.open(endpoint, progress.next_attempt()))
                inflight = self.router.begin(best.worker_id, placement, best)
                if settle:
                    self.admission.settled()
                    settle = False
                self._attempts.setdefault(best.worker_id, set()).add(attempt)
                blocks = self.router.registry.load(best.worker_id).prefill_blocks  # its queue's and this one's
                opened = time.monotonic()
                try:
                    first = True
                    # no deadline without another worker to go to: a slow first frame beats none
                    deadline = self.first_frames.timeout(best.worker_id, blocks) \
                        if len(placement.candidates) > 1 else None
                    while (frame := await self._read(attempt, deadline if first else None)) is not None:
                        if isinstance(frame.error, WORKER_ERRORS):
                            raise WorkerFailure(frame.error.message)
                        if first:
                            inflight.prefill_done()
                            route.add_event("first_frame")
                            self.first_frames.observe(best.worker_id, blocks, time.monotonic() - opened)
                            first = False
                        out = progress.absorb(frame, best.worker_id)
                        if out is not None:
                            yield out
                        if frame.final:
                            await attempt.stream.drain()
                            return
                    raise WorkerFailure("the worker's stream ended without a finish frame")
                except RequestRejected as rejected:
                    route.set_status(trace.StatusCode.ERROR, rejected.error.message)
                    raise rejected.error from None
                except WorkerFailure as failure:
                    route.set_status(trace.StatusCode.ERROR, failure.message)
                    if not progress.sent_any:
                        retries += 1
                        if retries > self.limits.max_retries:
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
                    if migrations > self.limits.migration_limit:
                        log.warning("router.migration_exhausted", request_id=request.request_id,
                                    worker_id=best.worker_id, migrations=migrations - 1)
                        raise errors.UnavailableError(
                            f"worker {best.worker_id} failed mid-stream ({failure.message}); "
                            f"migration limit {self.limits.migration_limit} reached") from None
                    log.warning("router.request_migrating", request_id=request.request_id,
                                worker_id=best.worker_id, tokens_so_far=len(progress.generated),
                                error=failure.message)
                finally:
                    route.end()
                    attempt.stream.cancel()
                    inflight.release()
                    self._attempts.get(best.worker_id, set()).discard(attempt)
                    self.admission.pump()
        finally:
            if settle:
                self.admission.settled()

    async def _read(self, attempt: _Attempt, first_frame: float | None = None) -> Frame | None:
        """The worker's next frame (None: end of stream); a stall, a first frame overdue (``first_frame``
        seconds) or the worker leaving is a :class:`WorkerFailure`."""
        overdue = first_frame is not None and first_frame < self.limits.stall_timeout
        limit = first_frame if first_frame is not None and overdue else self.limits.stall_timeout
        try:
            # asyncio.timeout, not wait_for: no Task per frame on the hot path.
            async with asyncio.timeout(limit):
                return await attempt.stream.read()
        except TimeoutError:
            if overdue:  # slow, not gone: it stays in the registry
                log.warning("router.first_frame_overdue", worker_id=attempt.worker_id, timeout=round(limit, 3))
                raise WorkerFailure(f"no first frame within {limit:.2f}s") from None
            gone = self.router.forget(attempt.worker_id)
            log.warning("router.worker_stalled", worker_id=attempt.worker_id, forgotten=gone is not None,
                        timeout=limit)
            raise WorkerFailure(f"no frame for {limit}s") from None
        except (asyncio.CancelledError, WorkerFailure, RequestRejected):
            if attempt.abandoned:  # cancelled by worker_gone: whatever the transport said, the worker left
                raise WorkerFailure("the worker left the mesh") from None
            raise

    def _route_span(self, request: ProxyRequest, placement: Placement, best: Candidate,
                    queue_wait: float, *, retry: bool, migrating: bool) -> trace.Span:
        """Log the decision and start the ``router.route`` span (ended by the caller with the attempt)."""
        mode = self.router.policy.mode
        reason = decision_reason(mode, best.overlap_blocks, len(placement.candidates),
                                 target=bool(request.target_worker_id) and best.worker_id == request.target_worker_id,
                                 retry=retry and not migrating, migration=migrating,
                                 predicted_blocks=best.predicted_blocks)
        self.metrics.decisions.labels(mode, reason).inc()
        shown = placement.candidates[:16]
        span = self._tracer.start_span("router.route", attributes={
            "router.mode": mode,
            "router.reason": reason,
            "router.worker_id": best.worker_id,
            "router.overlap_blocks": best.overlap_blocks,
            "router.new_blocks": best.new_blocks,
            "router.predicted_blocks": best.predicted_blocks,
            "router.request_blocks": placement.request_blocks,
            "router.candidates": len(placement.candidates),
            "router.candidate.workers": [c.worker_id for c in shown],
            "router.candidate.overlap_blocks": [c.overlap_blocks for c in shown],
            "router.candidate.predicted_blocks": [c.predicted_blocks for c in shown],
            "router.candidate.costs": [float(c.cost) for c in shown],
            "router.queue_wait_ms": round(queue_wait * 1000, 3),
            "router.migration": migrating,
            "router.prefill_only": request.prefill_only,
            "request.id": request.request_id,
        })
        log.info("router.route_decided", request_id=request.request_id, worker_id=best.worker_id, mode=mode,
                 reason=reason, overlap_blocks=best.overlap_blocks, predicted_blocks=best.predicted_blocks,
                 request_blocks=placement.request_blocks,
                 priority=request.priority, prefill_only=request.prefill_only,
                 queue_wait_ms=round(queue_wait * 1000, 3), candidates=describe(placement.candidates[:4]))
        return span
