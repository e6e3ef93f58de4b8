"""The gateway's one client of the parse service: typed errors, cancellation, a cached model info, and a
chat stream resumed on another parse replica when the one serving it goes away mid-stream."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, Mapping

import grpc
import structlog
from opentelemetry.instrumentation.utils import suppress_instrumentation

from gateway.admission import Admission
from gateway.model_aliases import ModelAliases, Resolution
from gateway.template_notes import note_request
from gateway.turn_tracking import TurnTracker
from services.api import chat_pb2, parse_pb2, parse_pb2_grpc
from services.common import errors, message_reuse
from services.common.mux import MuxChannel, method_name

CHAT = method_name("Parse", "Chat")
RESUME_LIMIT = 3  # resumes of one chat stream (as the router's --migration-limit for a worker's)
RESUME_BACKOFF = 0.05  # seconds before the first resume, doubled for each next one
STALE_LIMIT = 12  # a request's path answers model info up to this many TTLs old while it is fetched again

log = structlog.get_logger()


class Delivered:
    """What one chat's parse stream delivered so far: enough to continue it on another parse replica.

    Each batch carries the generated token ids its events came from (``token_ids_u32``, and their router
    frames' sizes); kept here with the tool call ids started and the ``Started`` prompt counts, they become
    the ``Continuation`` of the same chat sent again (see ``services/parse/continuation.py``). Only a stream
    that has begun (its ``Started`` came) and has not ended (no ``Finish`` or error) can resume.
    """

    def __init__(self) -> None:
        self._ids = bytearray()
        self._frames: list[int] = []
        self._call_ids: list[str] = []
        self._started: chat_pb2.Started | None = None
        self.ended = False
        self.resumes = 0

    @property
    def resumable(self) -> bool:
        return self._started is not None and not self.ended

    def observe(self, batch: chat_pb2.ChatEventBatch) -> None:
        ids = batch.token_ids_u32
        if ids:
            self._ids += ids
            self._frames.extend(batch.frame_sizes or (len(ids) // 4,))
            batch.ClearField("token_ids_u32")  # for the parse hop only: the APIs (the gRPC edge) never see it
            batch.ClearField("frame_sizes")
        for event in batch.events:
            kind = event.WhichOneof("event")
            if kind == "tool_call_start":
                self._call_ids.append(event.tool_call_start.id)
            elif kind == "started":
                self._started = event.started
            elif kind in ("finish", "error"):
                self.ended = True

    def continuation(self, request: chat_pb2.ChatRequest) -> chat_pb2.ChatRequest:
        """``request`` again, to go on where the stream so far ended (counts one more resume)."""
        assert self._started is not None
        self.resumes += 1
        out = chat_pb2.ChatRequest()
        out.CopyFrom(request)
        out.continuation.CopyFrom(chat_pb2.Continuation(
            token_ids_u32=bytes(self._ids), frame_sizes=self._frames, tool_call_ids=self._call_ids,
            prompt_tokens=self._started.prompt_tokens, cached_tokens=self._started.cached_tokens,
            resumes=self.resumes))
        return out


class ParseClient:
    """Wraps ``Parse`` over one channel. Every failure surfaces as a ``MeshError``.

    ``chat`` is an async generator: close it (``contextlib.aclosing``) and the gRPC call is
    cancelled, so a client that goes away cancels the request all the way to the worker. With a
    ``turns`` tracker every chat is observed as an agent turn (spans, metrics, trace records).

    A stream whose parse replica goes away after its first batch (UNAVAILABLE: the process died, the mux
    session was lost) is opened again with what it delivered (:class:`Delivered`), at most
    ``resume_limit`` times; the channel's next connection lands on another replica (a target listing
    several, ``ipv4:a,b``, or a Service). The caller sees one stream: every event once, one ``Started``.
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        timeout: float = 600.0,
        probe_timeout: float = 2.0,
        model_ttl: float = 5.0,
        served_model_name: str = "",
        aliases: ModelAliases | Mapping[str, str] | None = None,
        turns: TurnTracker | None = None,
        streams: MuxChannel | None = None,
        admission: Admission | None = None,
        resume_limit: int = RESUME_LIMIT,
        messages: message_reuse.MessageSender | None = None,
    ) -> None:
        self.admission = admission or Admission()
        self._resume_limit = resume_limit
        self._stub = parse_pb2_grpc.ParseStub(channel)
        # Chat streams on the parse service's mux session when given (the mesh), else one call each.
        self._chat = (streams.unary_stream(CHAT, chat_pb2.ChatEventBatch.FromString) if streams is not None
                      else self._stub.Chat)
        self.turns = turns
        self.messages = messages or message_reuse.MessageSender()  # a turn sends only its new messages
        self._timeout = timeout
        self._probe_timeout = probe_timeout
        self._model_ttl = model_ttl
        self._model: chat_pb2.ModelInfo | None = None
        self._model_at = 0.0
        self._refresh: asyncio.Future[None] | None = None  # a background GetModel (see get_model)
        self._served_name = served_model_name
        self.aliases = ModelAliases.coerce(aliases)  # --model-alias NAME=SERVED, NAME maybe a glob pattern

    async def chat(self, request: chat_pb2.ChatRequest) -> AsyncGenerator[chat_pb2.ChatEventBatch, None]:
        """Stream the parse service's event batches for ``request`` (once admitted: see ``gateway.admission``)."""
        async with self.admission.slot(request.hints.priority) as grant:
            async for batch in self._chat_stream(request):
                grant.first_frame()  # the turn's TTFT (only the first call counts) sizes the queue's wait budget
                yield batch

    async def _chat_stream(self, request: chat_pb2.ChatRequest) -> AsyncGenerator[chat_pb2.ChatEventBatch, None]:
        if not request.request_id or request.HasField("continuation"):
            request = _own(request)  # a resumed stream must keep its id; a continuation is ours alone to set
        message_reuse.strip(request)  # so is what parse holds
        turn = self.turns.begin(request) if self.turns is not None else None
        note_request(request, self._model)  # tools the model's template does not show: a header and a span mark
        # the messages after those parse holds (None: send it whole; always, to a parse that predates bases)
        short = self.messages.shorten(request) if self._model is not None and self._model.accepts_messages_base \
            else None
        with turn.attached() if turn is not None else contextlib.nullcontext():
            call = self._chat(short or request, timeout=self._timeout)
        delivered = Delivered()
        outcome = "cancelled"
        try:
            if turn is not None:
                await turn.loaded()  # shared turn links: the read begun with the turn, overlapped with the call
            while True:
                try:
                    batch = await call.read()
                except grpc.aio.AioRpcError as exc:
                    if short is not None and exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                        short = None  # parse does not hold the base (nothing was delivered): send it whole
                        with turn.attached() if turn is not None else contextlib.nullcontext():
                            call = self._chat(request, timeout=self._timeout)
                        continue
                    if not self._resumable(exc, delivered):
                        raise
                    await asyncio.sleep(RESUME_BACKOFF * 2 ** delivered.resumes)
                    log.warning("gateway.parse_stream_resumed", request_id=request.request_id,
                                error=f"{exc.code().name} {exc.details()}", resumes=delivered.resumes + 1)
                    call.cancel()
                    with turn.attached() if turn is not None else contextlib.nullcontext():
                        call = self._chat(delivered.continuation(request), timeout=self._timeout)
                    continue
                if batch is grpc.aio.EOF:
                    outcome = "ok"
                    return
                assert isinstance(batch, chat_pb2.ChatEventBatch)
                short = None  # parse took the request: no whole resend after this
                delivered.observe(batch)
                if turn is not None:
                    turn.observe(batch)
                    if turn.fold.finished:
                        await turn.saved()  # shared: written before the turn's end reaches the client
                yield batch
        except grpc.aio.AioRpcError as exc:
            outcome = "error"
            raise errors.from_rpc_error(exc) from exc
        finally:
            call.cancel()
            if turn is not None:
                turn.end(outcome)

    def _resumable(self, exc: grpc.aio.AioRpcError, delivered: Delivered) -> bool:
        return (exc.code() == grpc.StatusCode.UNAVAILABLE and delivered.resumable
                and delivered.resumes < self._resume_limit)

    async def get_model(self, *, fresh: bool = False, stale_ok: bool = False) -> chat_pb2.ModelInfo:
        """The parse service's model info, cached for ``model_ttl`` seconds.

        ``stale_ok`` (a request's own path): past the TTL the cached info is answered at once and fetched
        again in the background, so a turn that comes more than ``model_ttl`` after the last one does not
        wait a ``GetModel`` round trip before its own call; past ``STALE_LIMIT`` TTLs it waits as usual.
        """
        now = time.monotonic()
        if not fresh and self._model is not None:
            age = now - self._model_at
            if age < self._model_ttl:
                return self._model
            if stale_ok and age < STALE_LIMIT * self._model_ttl:
                if self._refresh is None or self._refresh.done():
                    self._refresh = asyncio.ensure_future(self._refresh_model())
                return self._model
        return await self._fetch_model()

    async def _fetch_model(self) -> chat_pb2.ModelInfo:
        started = time.monotonic()
        try:
            with suppress_instrumentation():  # a cached metadata probe: not part of any request's trace
                info: chat_pb2.ModelInfo = await self._stub.GetModel(
                    chat_pb2.ModelInfoRequest(), timeout=self._probe_timeout
                )
        except grpc.aio.AioRpcError as exc:
            raise errors.from_rpc_error(exc) from exc
        self._model, self._model_at = info, started
        return info

    async def _refresh_model(self) -> None:
        try:
            await self._fetch_model()
        except errors.MeshError as exc:  # the next request tries again (and past STALE_LIMIT waits for it)
            log.info("gateway.model_refresh_failed", error=exc.message)

    async def ready(self) -> parse_pb2.ReadyResponse:
        """Whether a chat can be served now (the parse service asks the router for routable workers)."""
        try:
            with suppress_instrumentation():
                reply: parse_pb2.ReadyResponse = await self._stub.Ready(parse_pb2.ReadyRequest(),
                                                                       timeout=self._probe_timeout)
        except grpc.aio.AioRpcError as exc:
            raise errors.from_rpc_error(exc) from exc
        return reply

    def public_name(self, info: chat_pb2.ModelInfo) -> str:
        """The model name clients see: the configured one, else the parse service's."""
        return self._served_name or info.served_model_name

    async def resolve_model(self, requested: str) -> tuple[str, chat_pb2.ModelInfo]:
        """The public name for ``requested`` (empty means the served model) and the model's info; unknown names
        raise 404. The resolution goes on the current span (and so on the access line; for a 404 the name asked
        for): see :meth:`resolve`."""
        try:
            resolution, info = await self.resolve(requested)
        except errors.NotFoundError:
            Resolution(requested, "", "").annotate_span()  # the name nothing serves: which alias would be missing
            raise
        resolution.annotate_span()
        return resolution.public, info

    async def resolve(self, requested: str) -> tuple[Resolution, chat_pb2.ModelInfo]:
        """How ``requested`` resolves: the served model's own names first, then ``--model-alias`` (exact names,
        then the first matching pattern). An alias stays the public name: clients see the name they asked for.
        """
        info = await self.get_model(stale_ok=True)
        public = self.public_name(info)
        if not requested or requested in (public, info.served_model_name):
            return Resolution(requested, public, public), info
        alias = self.aliases.match(requested)
        if alias is None:
            listed = f" and the aliases {', '.join(self.aliases.names())}" if len(self.aliases) else ""
            raise errors.NotFoundError(
                f"The model `{requested}` does not exist. This server serves `{public}`{listed}.", param="model"
            )
        if alias.target not in (public, info.served_model_name):
            raise errors.NotFoundError(
                f"The model `{requested}` is an alias (`{alias.name}`) of `{alias.target}`, which this server "
                f"does not serve: it serves `{public}`.", param="model"
            )
        return Resolution(requested, requested, public, alias), info

    async def tokenize(self, request: parse_pb2.TokenizeRequest) -> parse_pb2.TokenizeResponse:
        try:
            reply: parse_pb2.TokenizeResponse = await self._stub.Tokenize(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as exc:
            raise errors.from_rpc_error(exc) from exc
        return reply

    async def detokenize(self, token_ids: list[int]) -> str:
        try:
            detok: parse_pb2.DetokenizeResponse = await self._stub.Detokenize(
                parse_pb2.DetokenizeRequest(token_ids=token_ids), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as exc:
            raise errors.from_rpc_error(exc) from exc
        return str(detok.text)


def _own(request: chat_pb2.ChatRequest) -> chat_pb2.ChatRequest:
    out = chat_pb2.ChatRequest()
    out.CopyFrom(request)
    out.request_id = out.request_id or "chat-" + uuid.uuid4().hex
    out.ClearField("continuation")
    return out
