"""Agent turns as the gateway sees them: span links, harness tool time, metrics and trace records.

Every API ends in ``ParseClient.chat``; it hands each request to :meth:`TurnTracker.begin` and each
event batch to :meth:`Turn.observe`, so no handler does any of this itself. What the turn produced
(worker, usage, finish, dispatched calls, error) is read from a ``gateway.turn.TurnFold``, the same
fold the APIs' encoders read. Per turn:

* the current (root) span becomes the GenAI conventions' ``chat {model}`` span (:func:`annotate_chat_span`:
  identity under our names and ``gen_ai.*``, set once), with a link to the previous turn of the same
  trajectory (bounded map session/trajectory -> last root span context; with ``links``, a JetStream bucket
  every replica shares: ``turn_links.py``, read once while the parse call starts, written once as it ends);
* the identity becomes W3C baggage for the call to parse (replacing any baggage the context had), and
  rides on to every hop;
* tool results in the request that answer calls we dispatched earlier become ``execute_tool {tool}``
  spans from our dispatch to their arrival: the harness's tool time (bounded map tool_call_id -> dispatch
  time and name; shared per trajectory with ``links``);
* at the end: the usage attributes (``gen_ai.usage.*``, once), TTFT / inter-token / end-to-end histograms,
  cached-token ratio, dispatch lead time, and one trace record when a sink is configured.

Span attributes are built only when the span records (a sampler kept it): nothing per token, nothing for
an unsampled turn. ``ParseClient`` awaits :meth:`Turn.loaded` once the parse call is open and
:meth:`Turn.saved` before yielding the batch that finishes the turn; both return at once in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from opentelemetry import baggage, context, trace

from gateway.metrics import GatewayMetrics
from gateway.trace_records import TraceRecord, TraceRecordSink
from gateway.turn import OUTPUT, CallDispatched, ToolCall, TurnFold
from gateway.turn_links import Dispatched, JetStreamTurnLinks, TrajectoryLinks
from services.api import chat_pb2
from services.common.tracing import (
    GEN_AI_OPERATION,
    GEN_AI_PROVIDER,
    GEN_AI_REQUEST_MODEL,
    PROVIDER_NAME,
    conversation_attributes,
    identity_context,
)

# The API a request arrived through; the HTTP middleware sets it per route, the gRPC edge is the default.
API: ContextVar[str] = ContextVar("harnessmesh_api", default="grpc")


def annotate_chat_span(request: chat_pb2.ChatRequest) -> None:
    """Make the current span the turn's GenAI inference span: named ``chat {model}``, with the identity (our
    names and ``gen_ai.*``) and the request's model and sampling settings.

    Once per span (every API's handler calls it before admission, :meth:`TurnTracker.begin` again for callers
    that did not); nothing when the span does not record.
    """
    span = trace.get_current_span()
    if not span.is_recording() or getattr(span, "attributes", {}).get(GEN_AI_OPERATION) == "chat":
        return
    span.update_name(f"chat {request.model}")
    ident, sampling = request.identity, request.sampling
    attrs: dict[str, Any] = conversation_attributes(ident.session_id, ident.trajectory_id, ident.harness,
                                                    anonymous=ident.anonymous)
    attrs.update({GEN_AI_OPERATION: "chat", GEN_AI_PROVIDER: PROVIDER_NAME, GEN_AI_REQUEST_MODEL: request.model,
                  "gen_ai.response.id": request.request_id, "model": request.model,
                  "request.id": request.request_id, "harnessmesh.api": API.get()})
    if ident.parent_trajectory_id:
        attrs["trajectory.parent_id"] = ident.parent_trajectory_id
    if sampling.max_tokens:
        attrs["gen_ai.request.max_tokens"] = sampling.max_tokens
    for field in ("temperature", "top_p", "top_k", "seed"):
        if sampling.HasField(field):
            attrs[f"gen_ai.request.{field}"] = getattr(sampling, field)
    if sampling.stop:
        attrs["gen_ai.request.stop_sequences"] = list(sampling.stop)
    span.set_attributes(attrs)


def _bounded_put(table: OrderedDict[str, Any], key: str, value: Any, limit: int) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > limit:
        table.popitem(last=False)


class TurnTracker:
    """Per-process turn bookkeeping (bounded: the least recently used entries go first); with ``links`` a
    trajectory's previous turn and dispatched calls are shared by every gateway replica (``turn_links.py``)."""

    def __init__(self, tracer: trace.Tracer | None = None, metrics: GatewayMetrics | None = None,
                 records: TraceRecordSink | None = None, *, max_entries: int = 8192,
                 links: JetStreamTurnLinks | None = None) -> None:
        self.tracer = tracer or trace.get_tracer("harnessmesh.gateway")
        self.metrics = metrics
        self.records = records
        self.links = links
        self._limit = max_entries
        self._last_turn: OrderedDict[str, trace.SpanContext] = OrderedDict()
        self._dispatched: OrderedDict[str, Dispatched] = OrderedDict()
        self._saving: set[asyncio.Task[None]] = set()  # writes of turns that ended without a finish

    def begin(self, request: chat_pb2.ChatRequest) -> Turn:
        turn = Turn(self, request)
        root = trace.get_current_span()
        ident = request.identity
        annotate_chat_span(request)
        root_ctx = root.get_span_context()
        key = f"{ident.session_id}/{ident.trajectory_id}"
        if self.links is not None and not ident.anonymous:
            turn.share(_SharedTurn(self.links, key, root, root_ctx))  # read now, applied in Turn.loaded
            return turn
        if root_ctx.is_valid and not ident.anonymous:
            previous = self._last_turn.get(key)
            if previous is not None:
                root.add_link(previous, {"link.type": "previous_turn"})
            _bounded_put(self._last_turn, key, root_ctx, self._limit)
        if self._dispatched:
            self._tool_results(request, turn, root_ctx, self._dispatched.pop)
        return turn

    def _tool_results(self, request: chat_pb2.ChatRequest, turn: Turn, root: trace.SpanContext,
                      take: Callable[[str, None], Dispatched | None]) -> None:
        """``execute_tool {tool}`` spans for results of calls we dispatched (each taken once from ``take``): the
        harness's tool time, from our dispatch to the result's arrival, under the turn that carries the result."""
        now_ns = time.time_ns()
        sampled = root.trace_flags.sampled  # else no span would record
        for message in request.messages:
            if message.role != "tool" or not message.tool_call_id:
                continue
            dispatched = take(message.tool_call_id, None)
            if dispatched is None:
                continue
            seconds = max(now_ns - dispatched.at_ns, 0) / 1e9
            if sampled:
                self._tool_span(request, turn, dispatched, message, now_ns)
            turn.tool_results.append({"id": message.tool_call_id, "name": dispatched.name,
                                      "tool_ms": round(seconds * 1000, 3), "is_error": message.is_error})
            if self.metrics is not None:
                self.metrics.harness_tool.labels(dispatched.harness or "unknown").observe(seconds)

    def _tool_span(self, request: chat_pb2.ChatRequest, turn: Turn, dispatched: Dispatched,
                   message: chat_pb2.Message, now_ns: int) -> None:
        ident = request.identity
        attrs: dict[str, Any] = conversation_attributes(ident.session_id, ident.trajectory_id, ident.harness,
                                                        anonymous=ident.anonymous)
        attrs.update({GEN_AI_OPERATION: "execute_tool", GEN_AI_PROVIDER: PROVIDER_NAME,
                      "gen_ai.tool.name": dispatched.name, "gen_ai.tool.call.id": message.tool_call_id,
                      "gen_ai.tool.type": "function",  # run by the harness, not by us
                      "tool.name": dispatched.name, "tool.call_id": message.tool_call_id,
                      "tool.is_error": message.is_error})
        if message.is_error:
            attrs["error.type"] = "tool_error"
        links = [trace.Link(dispatched.turn, {"link.type": "dispatching_turn"})] if dispatched.turn.is_valid else []
        span = self.tracer.start_span(f"execute_tool {dispatched.name}", context=turn.context,
                                      kind=trace.SpanKind.INTERNAL, start_time=dispatched.at_ns, links=links,
                                      attributes=attrs)
        if message.is_error:
            span.set_status(trace.StatusCode.ERROR, "the tool reported an error")
        span.end(end_time=max(now_ns, dispatched.at_ns))

    def dispatched(self, call_id: str, value: Dispatched) -> None:
        _bounded_put(self._dispatched, call_id, value, self._limit)

    def save_later(self, turn: Turn) -> None:
        """Write ``turn``'s links in the background (its stream ended without a finish; nobody waits)."""
        task = asyncio.ensure_future(turn.saved())
        self._saving.add(task)
        task.add_done_callback(self._saving.discard)


class _SharedTurn:
    """One turn's share of a trajectory's links: the read begun at the start, what the end writes."""

    def __init__(self, store: JetStreamTurnLinks, key: str, root: trace.Span, root_ctx: trace.SpanContext) -> None:
        self.store = store
        self.key = key
        self.root = root
        self.root_ctx = root_ctx
        self.read: asyncio.Future[TrajectoryLinks] | None = asyncio.ensure_future(store.load(key))
        self.links = TrajectoryLinks()
        self.saved = False


class Turn:
    """One request's observation: fed every event batch, ended exactly once."""

    def __init__(self, tracker: TurnTracker, request: chat_pb2.ChatRequest) -> None:
        self._tracker = tracker
        self.request = request
        self.api = API.get()
        self.ts = time.time()
        self.started = time.monotonic()
        ident = request.identity
        # on a context without baggage: only the identity we resolved goes on to the inner hops
        self.context = identity_context(ident.session_id, ident.trajectory_id, ident.harness,
                                        parent=baggage.clear())
        self.first: float | None = None
        self.last: float | None = None
        self.fold = TurnFold()
        self.tool_calls: list[dict[str, Any]] = []
        self.tool_results: list[dict[str, Any]] = []
        self._dispatch_times: list[float] = []
        self._ended = False
        self._shared: _SharedTurn | None = None
        if tracker.metrics is not None:
            tracker.metrics.active.labels(self.api).inc()

    def share(self, shared: _SharedTurn) -> None:
        """Take this turn's links from (and give them to) the replicas' shared store."""
        self._shared = shared

    async def loaded(self) -> None:
        """Apply the trajectory's shared links (the read begun with the turn): the link to its previous turn
        and the spans of the tool results this request carries. Once; at once when nothing is shared."""
        shared = self._shared
        if shared is None or shared.read is None:
            return
        read, shared.read = shared.read, None
        links = await read
        if links.turn is not None and shared.root_ctx.is_valid:
            shared.root.add_link(links.turn, {"link.type": "previous_turn"})
        if links.calls:
            self._tracker._tool_results(self.request, self, shared.root_ctx, links.calls.pop)
        links.calls.update(shared.links.calls)  # dispatched before the read was applied
        shared.links = links

    async def saved(self) -> None:
        """Write the trajectory's links for its next turn: this turn as the one to link to, its dispatched calls
        beside those still unanswered. Once; at once when nothing is shared."""
        shared = self._shared
        if shared is None or shared.saved:
            return
        shared.saved = True
        await self.loaded()
        links = shared.links
        if shared.root_ctx.is_valid:
            links.turn = shared.root_ctx
        await shared.store.save(shared.key, links)

    @contextlib.contextmanager
    def attached(self) -> Iterator[None]:
        """Make the identity baggage current (around starting the parse call: its metadata carries it)."""
        token = context.attach(self.context)
        try:
            yield
        finally:
            context.detach(token)

    def observe(self, batch: chat_pb2.ChatEventBatch) -> None:
        output = [d for d in self.fold.feed(batch) if isinstance(d, OUTPUT)]
        if not output:
            return
        now = time.monotonic()
        if self.first is None:
            self.first = now
        self.last = now
        for d in output:
            if isinstance(d, CallDispatched):
                self._dispatch(d.call, now)

    def _dispatch(self, call: ToolCall, now: float) -> None:
        root = trace.get_current_span().get_span_context()
        dispatched = Dispatched(call.name, time.time_ns(), root, self.request.identity.harness)
        if self._shared is not None:
            self._shared.links.calls[call.id] = dispatched
        else:
            self._tracker.dispatched(call.id, dispatched)
        self._dispatch_times.append(now)
        self.tool_calls.append({"id": call.id, "name": call.name,
                                "dispatch_ms": round((now - self.started) * 1000, 3)})

    def end(self, outcome: str) -> None:
        """Record the turn: ``outcome`` is ok, error or cancelled (an in-band error makes ok an error)."""
        if self._ended:
            return
        self._ended = True
        if self._shared is not None and not self._shared.saved:
            self._tracker.save_later(self)
        fold = self.fold
        if fold.error is not None:
            outcome = "error"
        elif fold.finished:
            outcome = "ok"  # a consumer may stop reading right after the finish event
        elif outcome == "ok":
            outcome = "error"  # the stream ended without a finish
        now = time.monotonic()
        model, usage = self.request.model, fold.usage
        prompt, cached = usage.prompt_tokens, usage.cached_tokens
        ttft = None if self.first is None else self.first - self.started
        itl = None
        if self.first is not None and self.last is not None and usage.completion_tokens > 1:
            itl = (self.last - self.first) / (usage.completion_tokens - 1)
        root = trace.get_current_span()
        if root.is_recording():
            root.set_attributes(self._usage_attributes(outcome, ttft))
        metrics = self._tracker.metrics
        if metrics is not None:
            labels = (model, self.api)
            metrics.active.labels(self.api).dec()
            metrics.requests.labels(*labels, outcome).inc()
            metrics.e2e.labels(*labels).observe(now - self.started)
            if ttft is not None:
                metrics.ttft.labels(*labels).observe(ttft)
            if itl is not None:
                metrics.itl.labels(*labels).observe(itl)
            if prompt:
                metrics.prompt_tokens.labels(*labels).inc(prompt)
                metrics.cached_tokens.labels(*labels).inc(cached)
                metrics.cached_ratio.labels(*labels).observe(cached / prompt)
            metrics.completion_tokens.labels(*labels).inc(usage.completion_tokens)
            for at in self._dispatch_times:
                metrics.tool_dispatch_lead.labels(*labels).observe(now - at)
        if self._tracker.records is not None:
            self._tracker.records.write(self._record(outcome, ttft, itl, now))

    def _usage_attributes(self, outcome: str, ttft: float | None) -> dict[str, Any]:
        fold, usage = self.fold, self.fold.usage
        attrs: dict[str, Any] = {
            "gen_ai.usage.input_tokens": usage.prompt_tokens, "gen_ai.usage.output_tokens": usage.completion_tokens,
            "gen_ai.usage.cache_read.input_tokens": usage.cached_tokens,  # part of input_tokens
            "gen_ai.response.model": self.request.model,
            "harnessmesh.worker_id": fold.worker_id, "harnessmesh.outcome": outcome,
        }
        if usage.reasoning_tokens:
            attrs["gen_ai.usage.reasoning.output_tokens"] = usage.reasoning_tokens  # part of output_tokens
        if fold.finish_name:
            attrs["gen_ai.response.finish_reasons"] = [fold.finish_name]
        if ttft is not None:
            attrs["gen_ai.response.time_to_first_chunk"] = round(ttft, 6)
            attrs["harnessmesh.ttft_ms"] = round(ttft * 1000, 3)
        if outcome == "error":
            attrs["error.type"] = type(fold.error).__name__ if fold.error is not None else "_OTHER"
        return attrs

    def _record(self, outcome: str, ttft: float | None, itl: float | None, now: float) -> TraceRecord:
        ident, fold, usage = self.request.identity, self.fold, self.fold.usage
        ctx = trace.get_current_span().get_span_context()
        return TraceRecord(
            ts=round(self.ts, 6), request_id=self.request.request_id, api=self.api, model=self.request.model,
            session_id=ident.session_id, trajectory_id=ident.trajectory_id,
            parent_trajectory_id=ident.parent_trajectory_id, harness=ident.harness,
            trace_id=format(ctx.trace_id, "032x") if ctx.is_valid else "", outcome=outcome,
            finish_reason=fold.finish_name, worker_id=fold.worker_id, prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens, completion_tokens=usage.completion_tokens,
            reasoning_tokens=usage.reasoning_tokens,
            ttft_ms=None if ttft is None else round(ttft * 1000, 3),
            itl_ms=None if itl is None else round(itl * 1000, 3),
            e2e_ms=round((now - self.started) * 1000, 3), tool_calls=self.tool_calls, tool_results=self.tool_results,
        )
