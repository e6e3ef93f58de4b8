"""The gateway's one client of the parse service: typed errors, cancellation, a cached model info."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Mapping

import grpc
from opentelemetry.instrumentation.utils import suppress_instrumentation

from gateway.admission import Admission
from gateway.turn_tracking import TurnTracker
from services.api import chat_pb2, parse_pb2, parse_pb2_grpc
from services.common import errors
from services.common.mux import MuxChannel, method_name

CHAT = method_name("Parse", "Chat")


class ParseClient:
    """Wraps ``Parse`` over one channel. Every failure surfaces as a ``MeshError``.

    ``chat`` is an async generator: close it (``contextlib.aclosing``) and the gRPC call is
    cancelled, so a client that goes away cancels the request all the way to the worker. With a
    ``turns`` tracker every chat is observed as an agent turn (spans, metrics, trace records).
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        timeout: float = 600.0,
        probe_timeout: float = 2.0,
        model_ttl: float = 5.0,
        served_model_name: str = "",
        aliases: Mapping[str, str] | None = None,
        turns: TurnTracker | None = None,
        streams: MuxChannel | None = None,
        admission: Admission | None = None,
    ) -> None:
        self.admission = admission or Admission()
        self._stub = parse_pb2_grpc.ParseStub(channel)
        # Chat streams on the parse service's mux session when given (the mesh), else one call each.
        self._chat = (streams.unary_stream(CHAT, chat_pb2.ChatEventBatch.FromString) if streams is not None
                      else self._stub.Chat)
        self.turns = turns
        self._timeout = timeout
        self._probe_timeout = probe_timeout
        self._model_ttl = model_ttl
        self._model: chat_pb2.ModelInfo | None = None
        self._model_at = 0.0
        self._served_name = served_model_name
        self.aliases: dict[str, str] = dict(aliases or {})  # --model-alias NAME=SERVED

    async def chat(self, request: chat_pb2.ChatRequest) -> AsyncGenerator[chat_pb2.ChatEventBatch, None]:
        """Stream the parse service's event batches for ``request`` (once admitted: see ``gateway.admission``)."""
        async with self.admission.slot(request.hints.priority) as grant:
            async for batch in self._chat_stream(request):
                grant.first_frame()  # the turn's TTFT (only the first call counts) sizes the queue's wait budget
                yield batch

    async def _chat_stream(self, request: chat_pb2.ChatRequest) -> AsyncGenerator[chat_pb2.ChatEventBatch, None]:
        turn = self.turns.begin(request) if self.turns is not None else None
        with turn.attached() if turn is not None else contextlib.nullcontext():
            call = self._chat(request, timeout=self._timeout)
        outcome = "cancelled"
        try:
            if turn is not None:
                await turn.loaded()  # shared turn links: the read begun with the turn, overlapped with the call
            while True:
                batch = await call.read()
                if batch is grpc.aio.EOF:
                    outcome = "ok"
                    return
                assert isinstance(batch, chat_pb2.ChatEventBatch)
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

    async def get_model(self, *, fresh: bool = False) -> chat_pb2.ModelInfo:
        """The parse service's model info, cached for a few seconds."""
        now = time.monotonic()
        if not fresh and self._model is not None and now - self._model_at < self._model_ttl:
            return self._model
        try:
            with suppress_instrumentation():  # a cached metadata probe: not part of any request's trace
                info: chat_pb2.ModelInfo = await self._stub.GetModel(
                    chat_pb2.ModelInfoRequest(), timeout=self._probe_timeout
                )
        except grpc.aio.AioRpcError as exc:
            raise errors.from_rpc_error(exc) from exc
        self._model, self._model_at = info, now
        return info

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
        """The public name for ``requested`` (empty means the served model); unknown names raise 404.

        An alias resolves to its target and stays the public name: clients see the name they asked for.
        """
        if requested in self.aliases:
            _, info = await self.resolve_model(self.aliases[requested])
            return requested, info
        info = await self.get_model()
        public = self.public_name(info)
        if requested and requested not in (public, info.served_model_name):
            raise errors.NotFoundError(
                f"The model `{requested}` does not exist. This server serves `{public}`.", param="model"
            )
        return public, info

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
