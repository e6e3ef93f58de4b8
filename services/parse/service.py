"""The Parse gRPC servicer: Chat (render -> router -> typed events), Tokenize, Detokenize, GetModel."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Sequence
from typing import Any

import grpc
import structlog
from opentelemetry import trace

from services.api import chat_pb2, parse_pb2, parse_pb2_grpc, router_pb2, router_pb2_grpc, worker_pb2
from services.common import errors, token_bytes
from services.common.errors import InvalidRequestError, MeshError
from services.common.message_reuse import HeldLine, MessageStore
from services.common.model_dir import input_modalities
from services.common.prompt_reuse import ReusingStub, prompt_key
from services.common.service_settings import INLINE_RENDER_MESSAGES, INLINE_WORK_BYTES, INLINE_WORK_MESSAGES
from services.common.tool_wait import ToolWaits
from services.common.tracing import GEN_AI_REQUEST_MODEL, conversation_attributes
from services.parse import convert
from services.parse.break_cause import TurnShape
from services.parse.chat_turn import ChatTurn, RouterStream
from services.parse.continuation import Continued
from services.parse.conversation import ChatMessage, Conversation
from services.parse.limits import RequestLimits
from services.parse.metrics import ParseMetrics
from services.parse.model_format import ModelFormat, Prompt
from services.parse.parsers.events import Event, ReasoningDelta, ToolCallDispatch
from services.parse.prefix_state import LocalPrefixState, PrefixState
from services.parse.prefix_watch import PrefixBreak, PrefixWatch, session_key
from services.parse.retention import TOOL_WAIT_RULE, TOOL_WAIT_S, kv_retention
from services.parse.router_replicas import RouterInfo
from services.parse.router_stream import ResumingRouterStream
from services.parse.speculative import SpeculativePrefiller, TurnRecorder

log = structlog.get_logger()

READY_TIMEOUT = 1.0  # seconds the router gets to list its workers for a readiness check


def _small(request: chat_pb2.ChatRequest, held: int) -> bool:
    """Whether ``request`` is converted and rendered on the event loop (see ``INLINE_WORK_BYTES``): its own messages
    are few and small, and with the ``held`` ones before them (a continued conversation) few enough to render in a
    couple of milliseconds. Its tokenization may still go to a thread (see ``ParseService._prompt``)."""
    return (len(request.messages) <= INLINE_WORK_MESSAGES and held + len(request.messages) <= INLINE_RENDER_MESSAGES
            and sum(message.ByteSize() for message in request.messages) <= INLINE_WORK_BYTES)


class ParseService(parse_pb2_grpc.ParseServicer):
    """Serves ``harnessmesh.v1.Parse`` for one model; the router stub is where tokens come from."""

    def __init__(
        self,
        model_format: ModelFormat,
        router: ReusingStub,
        tracer: trace.Tracer | None = None,
        created: int | None = None,
        prefix_watch: PrefixWatch | None = None,
        metrics: ParseMetrics | None = None,
        limits: RequestLimits | None = None,
        router_info: RouterInfo | router_pb2_grpc.RouterStub | None = None,
        prefix_state: PrefixState | None = None,
        messages: MessageStore[ChatMessage] | None = None,
        tool_waits: ToolWaits | None = None,
    ) -> None:
        self.metrics = metrics or ParseMetrics()
        self._format = model_format
        self._router = router
        self._router_info = router_info  # unary calls to the router (ListWorkers for Ready)
        self._limits = limits or RequestLimits()  # the shape a request may have (limits.py)
        self._tracer = tracer or trace.get_tracer("harnessmesh.parse")
        self._created = int(time.time()) if created is None else created
        self.speculative = SpeculativePrefiller(model_format, router)  # issue 5: speculative prefill hook
        self._prefix_watch = prefix_watch or PrefixWatch(model_format.decode, on_break=self._count_break)
        self._prefix_state = prefix_state or LocalPrefixState()  # memory, or shared by replicas (prefix_state.py)
        self.messages = messages or MessageStore()  # conversations the gateway sends as their new messages
        self._tasks: set[asyncio.Future[None]] = set()  # work that outlives its Chat call (prefix-state pushes)
        # each harness's tool waits, learnt from consecutive turns of its sessions (KV retention's tool-call hold)
        self.tool_waits = tool_waits or ToolWaits(TOOL_WAIT_RULE)
        self.metrics.watch_tool_waits(self.tool_waits)

    def _count_break(self, report: PrefixBreak) -> None:
        self.metrics.prefix_breaks.labels(str(report.in_output).lower(), report.cause).inc()

    async def Chat(
        self, request: chat_pb2.ChatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[chat_pb2.ChatEventBatch]:
        self.metrics.active.inc()
        outcome = "cancelled"
        try:
            async for batch in self._chat(request, context):
                if batch.events and batch.events[-1].HasField("error"):
                    outcome = "error"
                yield batch
            if outcome == "cancelled":
                outcome = "ok"
        except grpc.aio.AbortError:
            outcome = "rejected"
            raise
        finally:
            self.metrics.active.dec()
            self.metrics.requests.labels(outcome).inc()

    async def _chat(
        self, request: chat_pb2.ChatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[chat_pb2.ChatEventBatch]:
        request_id = request.request_id or uuid.uuid4().hex
        ident = request.identity
        attrs = conversation_attributes(ident.session_id, ident.trajectory_id, ident.harness,
                                        anonymous=ident.anonymous)
        attrs |= {"request.id": request_id, GEN_AI_REQUEST_MODEL: request.model}
        session = session_key(request.identity)
        waited = self.tool_waits.turn_arrived(session, self.tool_waits.clock()) if session else None
        # the session's shared prefix-watch state, fetched while the prompt renders (no round trip of its own)
        shared = self._prefix_state.shared
        pulled = asyncio.ensure_future(self._prefix_state.pull(self._prefix_watch, session)) if shared else None
        try:
            continued = Continued.from_proto(request.continuation) if request.HasField("continuation") else None
            conversation, prompt, max_tokens = await self._prompt(request, attrs)
        except MeshError as err:
            if pulled is not None:
                pulled.cancel()
            log.info("parse.request_rejected", request_id=request_id, error=err.message, param=err.param)
            await errors.abort_with(context, err)
            return
        generate, packed = router_request(request, prompt, max_tokens, request_id=request_id,
                                          model=self._format.served_model_name,
                                          stop_token_ids=self._format.stop_token_ids,
                                          tool_wait_s=self.tool_waits.hold_s(ident.harness))
        with self._tracer.start_as_current_span("parse.stream", attributes=attrs) as span:
            _retention_attributes(span, generate.retention, waited)
            if pulled is not None:
                await pulled
            pushed: list[asyncio.Future[None]] = []
            turn = ChatTurn(
                request_id=request_id, model=self._format.served_model_name, prompt_tokens=len(prompt.token_ids),
                pipeline=self._format.output_pipeline(prompt.text, prompt.schemas,
                                                      continued.call_ids if continued is not None else ()),
                watched=self._prefix_watch.begin(session, prompt.token_ids, report=continued is None, shape=TurnShape(
                    conversation.messages, conversation.tools, generate.cache_salt)),
                continued=continued, observe=_SpanEvents(span, self.metrics).observe,
                spec_turn=TurnRecorder() if request.hints.speculative_prefill else None,  # speculative prefill
                on_finish=lambda turn: pushed.extend(self._turn_finished(turn, request, conversation, session)))
            call: RouterStream
            if continued is None:
                call = ResumingRouterStream(self._router, generate, prompt=packed, key=prompt_key(session, packed),
                                            retry=self._router.retry_unavailable)
            else:  # the rest of a stream a replica that went away began: replay what it sent, silently
                span.set_attribute("parse.continued_tokens", len(continued.token_ids))
                turn.replay(continued.frames)
                rest = continued.router_request(generate, packed)
                call = (continued.finished_stream() if rest is None else ResumingRouterStream(
                    self._router, rest[0], prompt=rest[1], key=prompt_key(session, rest[1]),
                    retry=self._router.retry_unavailable))
            async for batch in turn.stream(call):
                yield batch
            if turn.error is not None:
                span.set_status(trace.StatusCode.ERROR, turn.error.message)
                log.warning("parse.stream_error", request_id=request_id, error=turn.error.message, sent=turn.sent)
                if not turn.sent:
                    await errors.abort_with(context, turn.error)
                    return
                yield chat_pb2.ChatEventBatch(events=[convert.error_event(errors.to_proto(turn.error))])
                return
            for push in pushed:  # the shared state is written before EOF (when the consumer is still there)
                await push

    def _turn_finished(self, turn: ChatTurn, request: chat_pb2.ChatRequest, conversation: Conversation,
                       session: str) -> list[asyncio.Future[None]]:
        """At the turn's finish frame, before its batch goes out: the turn is recorded in the prefix watch (and
        its sharing with other replicas starts), handed to speculative prefill and logged. Returns the push."""
        pushes: list[asyncio.Future[None]] = []
        if turn.pipeline.tool_calls and session:  # the harness runs the tool: the session's next turn ends the wait
            self.tool_waits.tool_call_ended(session, request.identity.harness, self.tool_waits.clock())
        if turn.watched is not None:
            turn.watched.commit(turn.output.message())
            self.metrics.prefix_turns.inc()
            if self._prefix_state.shared:
                pushes.append(self._background(self._prefix_state.push(self._prefix_watch, session)))
        if turn.spec_turn is not None and turn.worker_id:
            self.speculative.after_turn(request, turn.spec_turn, request_id=turn.request_id,
                                        worker_id=turn.worker_id, conversation=conversation)
        log.info("parse.request_finished", request_id=turn.request_id, prompt_tokens=turn.prompt_tokens,
                 tool_calls=turn.pipeline.tool_calls)
        return pushes

    def _background(self, work: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        """``work`` as a task that outlives the Chat call (kept referenced until done)."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _prompt(
        self, request: chat_pb2.ChatRequest, attrs: dict[str, str]
    ) -> tuple[Conversation, Prompt, int]:
        """The conversation, its rendered prompt and the ``max_tokens`` the router gets (see
        :meth:`ModelFormat.fit_max_tokens`)."""
        with self._tracer.start_as_current_span("parse.render", attributes=attrs) as span:
            started = time.monotonic()
            held = self.messages.held(request)  # the messages before request.messages, when it has a base
            small = _small(request, len(held))
            base = self.messages.base_digests(request)
            if small:
                conversation, kept = self._conversation(request, held, base)
            else:  # ~11 us a message: 40k messages would hold the event loop (and the mux heartbeats) ~0.4 s
                conversation, kept = await asyncio.to_thread(self._conversation, request, held, base)
            self.messages.put(request, kept)
            session = session_key(request.identity)
            if small:  # bounded work (see _small): a thread handoff would cost more than the render
                reuse = self._format.token_reuse(self._format.render(conversation), session=session)
                if reuse.new_chars <= INLINE_WORK_BYTES:  # an agent's next turn
                    prompt = self._format.tokenize_prompt(conversation, reuse)
                else:
                    prompt = await asyncio.to_thread(self._format.tokenize_prompt, conversation, reuse)
            else:
                prompt = await asyncio.to_thread(self._format.build_prompt, conversation, session=session)
            span.set_attributes({"prompt.tokens": len(prompt.token_ids), "prompt.messages": len(conversation.messages),
                                 "prompt.tools": len(request.tools), "prompt.build": prompt.build,
                                 "prompt.build_reason": prompt.build_reason,
                                 "prompt.reused_tokens": prompt.reused_tokens})
            self.metrics.render.observe(time.monotonic() - started)
            self.metrics.prompt_tokens.inc(len(prompt.token_ids))
            self.metrics.prompt_builds.labels(prompt.build, prompt.build_reason).inc()
            self.metrics.prompt_reused_tokens.inc(prompt.reused_tokens)
            # The cap is clamped here, where the prompt is known (a prompt with no room left fails in this span).
            return conversation, prompt, self._format.fit_max_tokens(len(prompt.token_ids), request.sampling.max_tokens)

    def _conversation(self, request: chat_pb2.ChatRequest, held: Sequence[ChatMessage], base: list[int]
                      ) -> tuple[Conversation, HeldLine[ChatMessage] | None]:
        """``request`` checked against the limits and converted, after the ``held`` messages (whose digests are
        ``base``), and what the message store is to keep of it (touches no shared state: it may run off the
        event loop)."""
        self._limits.check(request, held=len(held))
        conversation = convert.conversation_from_proto(request, held)
        return conversation, MessageStore.prepare(request, base, conversation.messages, convert.message_size)

    async def Tokenize(
        self, request: parse_pb2.TokenizeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> parse_pb2.TokenizeResponse:
        try:
            kind = request.WhichOneof("input")
            if kind == "chat":
                if request.chat.HasField("messages_base"):
                    raise InvalidRequestError("a messages base is for Chat only: send every message",
                                              param="chat.messages_base")
                self._limits.check(request.chat)
                prompt = await asyncio.to_thread(
                    self._format.build_prompt, convert.conversation_from_proto(request.chat))
                return parse_pb2.TokenizeResponse(
                    token_ids=prompt.token_ids, max_model_len=self._format.max_model_len, rendered=prompt.text)
            if kind == "prompt":
                ids = self._format.encode(request.prompt, add_special_tokens=request.add_special_tokens)
                return parse_pb2.TokenizeResponse(token_ids=ids, max_model_len=self._format.max_model_len)
            raise InvalidRequestError("set chat or prompt", param="input")
        except MeshError as err:
            await errors.abort_with(context, err)
            raise  # unreachable: abort raises

    async def Detokenize(
        self, request: parse_pb2.DetokenizeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> parse_pb2.DetokenizeResponse:
        return parse_pb2.DetokenizeResponse(text=self._format.decode(list(request.token_ids)))

    async def GetModel(
        self, request: chat_pb2.ModelInfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> chat_pb2.ModelInfo:
        fmt = self._format
        return chat_pb2.ModelInfo(
            served_model_name=fmt.served_model_name,
            max_model_len=fmt.max_model_len,
            reasoning_parser=fmt.reasoning_parser,
            tool_parser=fmt.tool_parser,
            created=self._created,
            input_modalities=input_modalities(fmt.model_dir.config),
            accepts_messages_base=True,
            **fmt.forms.model_info(),
        )


    async def Ready(
        self, request: parse_pb2.ReadyRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> parse_pb2.ReadyResponse:
        if self._router_info is None:
            return parse_pb2.ReadyResponse(ready=False, reason="no router is configured")
        try:
            listed = await self._router_info.ListWorkers(router_pb2.ListWorkersRequest(), timeout=READY_TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            return parse_pb2.ReadyResponse(ready=False, reason=f"the router does not answer: {exc.code().name}")
        workers = len(listed.workers)
        if not workers:
            return parse_pb2.ReadyResponse(ready=False, reason="no worker is routable (none has a live heartbeat)")
        return parse_pb2.ReadyResponse(ready=True, workers=workers)


def router_request(
    request: chat_pb2.ChatRequest, prompt: Prompt, max_tokens: int, *, request_id: str, model: str,
    stop_token_ids: tuple[int, ...], tool_wait_s: float = TOOL_WAIT_S,
) -> tuple[worker_pb2.GenerateRequest, bytes]:
    """The router's request for a chat turn (the client's sampling with ``max_tokens`` as given: the client's
    cap fitted to the context; a tool-call turn's blocks held ``tool_wait_s``) and its prompt's ids packed, which
    go beside it. ``request`` is left as it came."""
    out = convert.generate_request(request, prompt, request_id=request_id, model=model, stop_token_ids=stop_token_ids)
    out.sampling.max_tokens = max_tokens
    out.retention.CopyFrom(kv_retention(request, tool_wait_s))
    return out, token_bytes.pack(prompt.token_ids)


def _retention_attributes(span: trace.Span, retention: worker_pb2.KvRetention, waited: float | None) -> None:
    """The turn's KV retention hint (docs/agent-kv.md) and the tool wait its arrival ended, on its span."""
    attrs: dict[str, float | bool] = {}
    if retention.tool_call_hold_s:
        attrs["parse.kv_retention.tool_call_hold_s"] = retention.tool_call_hold_s
    if retention.answer_evict_first:
        attrs["parse.kv_retention.answer_evict_first"] = True
    if retention.evict_first:
        attrs["parse.kv_retention.evict_first"] = True
    if waited is not None:
        attrs["parse.tool_wait_s"] = round(waited, 3)
    if attrs:
        span.set_attributes(attrs)


class _SpanEvents:
    """Marks reasoning start/end and each tool call dispatch (with its time since the first token) on the
    stream's span; one pass over each frame's events, no span per token."""

    def __init__(self, span: trace.Span, metrics: ParseMetrics) -> None:
        self._span = span
        self._metrics = metrics
        self._reasoning = False
        self._first: float | None = None

    def observe(self, events: list[Event]) -> None:
        if events and self._first is None:
            self._first = time.monotonic()
            self._span.add_event("first_token")
        for event in events:
            if isinstance(event, ReasoningDelta):
                if not self._reasoning:
                    self._span.add_event("reasoning.start")
                    self._reasoning = True
                continue
            if self._reasoning:
                self._span.add_event("reasoning.end")
                self._reasoning = False
            if isinstance(event, ToolCallDispatch):
                since = time.monotonic() - (self._first or time.monotonic())
                self._span.add_event("tool_call.dispatch", {
                    "tool_call.index": event.index, "tool_call.id": event.id, "tool_call.name": event.name,
                    "gen_ai.tool.name": event.name, "tool_call.since_first_token_ms": round(since * 1000, 3)})
                self._metrics.tool_dispatches.inc()


__all__ = ["ParseService"]
