"""The Worker gRPC service: a thin adapter from ``Generate`` / ``Info`` to an :class:`Engine`."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any, TypeAlias

import grpc
import structlog
from opentelemetry import trace

from services.api import worker_pb2, worker_pb2_grpc
from services.common import errors
from services.worker import convert
from services.worker.engine import Engine

log = structlog.get_logger()

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    """Streams an engine's outputs as ``GenerateResponse`` frames, one per engine output.

    First frame: ``prompt`` (prompt/cached tokens, worker id). Last frame: ``finish_reason`` and
    ``usage``. Errors before the first frame end the RPC with a status; after it they go in-band.
    Client cancellation cancels the handler, which closes the engine stream (the engine aborts).
    """

    def __init__(
        self,
        engine: Engine,
        worker_id: str,
        worker_info: Callable[[], worker_pb2.WorkerInfo],
        tracer: trace.Tracer | None = None,
    ) -> None:
        self._engine = engine
        self._worker_id = worker_id
        self._worker_info = worker_info
        self._tracer = tracer or trace.get_tracer("harnessmesh.worker")

    async def Generate(
        self, request: worker_pb2.GenerateRequest, context: Context  # type: ignore[override]
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        req = convert.request_from_proto(request)
        if not req.request_id:
            req = replace(req, request_id=f"req-{uuid.uuid4().hex[:12]}")
        started = time.monotonic()
        with self._tracer.start_as_current_span("worker.generate") as span:
            span.set_attribute("harnessmesh.request_id", req.request_id)
            span.set_attribute("harnessmesh.prompt_tokens", len(req.token_ids))
            stream = self._engine.generate(req)
            sent_first = False
            try:
                async for out in stream:
                    if out.prompt is not None:
                        span.set_attribute("harnessmesh.cached_tokens", out.prompt.cached_tokens)
                    if not sent_first and out.token_ids:
                        span.add_event("first_token")
                    if out.finish_reason is not None and out.usage is not None:
                        span.set_attribute("harnessmesh.completion_tokens", out.usage.completion_tokens)
                        span.set_attribute("harnessmesh.finish_reason", out.finish_reason)
                        log.info("worker.request_finished", request_id=req.request_id,
                                 prompt_tokens=out.usage.prompt_tokens, cached_tokens=out.usage.cached_tokens,
                                 completion_tokens=out.usage.completion_tokens, finish_reason=out.finish_reason,
                                 seconds=round(time.monotonic() - started, 4))
                    yield convert.output_to_proto(out, self._worker_id)
                    sent_first = True
            except errors.MeshError as err:
                span.set_attribute("harnessmesh.error", err.message)
                if not sent_first:
                    await errors.abort_with(context, err)  # raises: ends the RPC with the status
                yield worker_pb2.GenerateResponse(error=errors.to_proto(err))
            except Exception as exc:
                if isinstance(exc, grpc.aio.AbortError):
                    raise
                internal = errors.as_mesh_error(exc)
                log.exception("worker.generate_failed", request_id=req.request_id)
                if not sent_first:
                    await errors.abort_with(context, internal)
                yield worker_pb2.GenerateResponse(error=errors.to_proto(internal))
            finally:
                await stream.aclose()

    async def Info(
        self, request: worker_pb2.WorkerInfoRequest, context: Context  # type: ignore[override]
    ) -> worker_pb2.WorkerInfo:
        return self._worker_info()
