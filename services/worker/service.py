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
from services.common.prompt_reuse import PromptStore
from services.worker import convert
from services.worker.engine import Engine, EngineOutput
from services.worker.metrics import WorkerMetrics

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
        metrics: WorkerMetrics | None = None,
        prompts: PromptStore | None = None,
    ) -> None:
        self.metrics = metrics or WorkerMetrics()
        self.prompts = prompts or PromptStore()  # prompts the router sent, for a session's next prompt tail
        self._engine = engine
        self._worker_id = worker_id
        self._worker_info = worker_info
        self._tracer = tracer or trace.get_tracer("harnessmesh.worker")

    async def Generate(
        self, request: worker_pb2.GenerateRequest, context: Context  # type: ignore[override]
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        try:
            prompt = self.prompts.resolve(request)
        except errors.MeshError as err:
            await errors.abort_with(context, err)  # raises: the router sends the whole prompt again
        req = convert.request_from_proto(request, prompt)
        if not req.request_id:
            req = replace(req, request_id=f"req-{uuid.uuid4().hex[:12]}")
        started = time.monotonic()
        with self._tracer.start_as_current_span("worker.generate") as span:
            span.set_attributes({"request.id": req.request_id, "worker.id": self._worker_id,
                                 "worker.prompt_tokens": len(req.token_ids)})
            if (req.retention_hold_s or req.retention_tool_call_hold_s or req.retention_first
                    or req.retention_answer_first):  # docs/agent-kv.md
                span.set_attributes({"worker.kv_retention.hold_s": req.retention_hold_s,
                                     "worker.kv_retention.tool_call_hold_s": req.retention_tool_call_hold_s,
                                     "worker.kv_retention.evict_first": req.retention_first,
                                     "worker.kv_retention.answer_evict_first": req.retention_answer_first})
            stream = self._engine.generate(req)
            sent_first = False
            try:
                async for out in stream:
                    if out.prompt is not None or (not sent_first and out.token_ids):
                        self._first_output(span, out, started, first_token=not sent_first and bool(out.token_ids))
                    if out.finish_reason is not None and out.usage is not None:
                        self._finished(span, req.request_id, out, started)
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

    def _first_output(self, span: trace.Span, out: EngineOutput, started: float, *, first_token: bool) -> None:
        """Queue, prefill (cached vs new tokens) and first token, as attributes and timed events."""
        now = time.monotonic()
        if out.prompt is not None:
            p = out.prompt
            attrs: dict[str, float | int] = {"worker.cached_tokens": p.cached_tokens,
                                             "worker.new_tokens": p.prompt_tokens - p.cached_tokens}
            start_ns = getattr(span, "start_time", None)  # the SDK's span; None when tracing is off
            if p.queue_seconds is not None:
                attrs["worker.queue_ms"] = round(p.queue_seconds * 1000, 3)
                self.metrics.queue.observe(p.queue_seconds)
                if isinstance(start_ns, int):
                    span.add_event("prefill.start", timestamp=start_ns + int(p.queue_seconds * 1e9))
            if p.prefill_seconds is not None:
                attrs["worker.prefill_ms"] = round(p.prefill_seconds * 1000, 3)
            span.set_attributes(attrs)
            span.add_event("prefill.done", {"cached_tokens": p.cached_tokens,
                                            "new_tokens": p.prompt_tokens - p.cached_tokens})
        if first_token:
            span.add_event("first_token")
            span.set_attribute("worker.ttft_ms", round((now - started) * 1000, 3))
            self.metrics.ttft.observe(now - started)

    def _finished(self, span: trace.Span, request_id: str, out: EngineOutput, started: float) -> None:
        assert out.usage is not None and out.finish_reason is not None
        usage, seconds = out.usage, time.monotonic() - started
        ttft_ms = (getattr(span, "attributes", None) or {}).get("worker.ttft_ms")
        if isinstance(ttft_ms, float):  # decode: first token -> finish
            span.set_attribute("worker.decode_ms", round(seconds * 1000 - ttft_ms, 3))
        span.set_attributes({"worker.completion_tokens": usage.completion_tokens,
                             "worker.finish_reason": out.finish_reason, "worker.seconds": round(seconds, 6)})
        span.add_event("finish", {"finish_reason": out.finish_reason})
        self.metrics.requests.labels(out.finish_reason).inc()
        self.metrics.prompt_tokens.inc(usage.prompt_tokens)
        self.metrics.cached_tokens.inc(usage.cached_tokens)
        self.metrics.generated_tokens.inc(usage.completion_tokens)
        log.info("worker.request_finished", request_id=request_id, prompt_tokens=usage.prompt_tokens,
                 cached_tokens=usage.cached_tokens, completion_tokens=usage.completion_tokens,
                 finish_reason=out.finish_reason, seconds=round(seconds, 4))

    async def Info(
        self, request: worker_pb2.WorkerInfoRequest, context: Context  # type: ignore[override]
    ) -> worker_pb2.WorkerInfo:
        return self._worker_info()
