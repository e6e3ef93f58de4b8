"""``POST /v1/messages`` (streaming and not) and ``POST /v1/messages/count_tokens``."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

import structlog
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.anthropic.convert import chat_request, strip_preamble, thinking_blocks
from gateway.anthropic.errors import error_response, from_validation_error, sse_error
from gateway.anthropic.events import PING, Event, MessageAssembler, MessageEncoder, sse_events
from gateway.anthropic.models import CountTokensRequest, MessagesRequest
from gateway.anthropic.signing import ThinkingSigner
from gateway.handler_util import annotate_span, cancel_on_disconnect, first_frame, read_json
from gateway.parse_client import ParseClient
from gateway.sse import EventStreamResponse
from services.api import chat_pb2, parse_pb2

log = structlog.get_logger()
_Body = TypeVar("_Body", bound=CountTokensRequest)


class MessagesApi:
    """The Anthropic Messages endpoints over a ``ParseClient``.

    ``strip`` is the default of the billing-header strip (``--strip-anthropic-preamble``);
    ``ping_interval`` is the longest silence of a stream before a ``ping`` event.
    """

    def __init__(
        self,
        parse: ParseClient,
        signer: ThinkingSigner,
        *,
        strip: bool = True,
        ping_interval: float = 10.0,
    ) -> None:
        self._parse = parse
        self._signer = signer
        self._strip = strip
        self._ping_interval = ping_interval

    async def _body(self, request: Request, cls: type[_Body]) -> _Body:
        try:
            return cls.model_validate(await read_json(request))
        except ValidationError as exc:
            raise from_validation_error(exc) from exc

    async def _convert(self, body: CountTokensRequest, request: Request, request_id: str) -> tuple[
            str, chat_pb2.ChatRequest]:
        public, info = await self._parse.resolve_model(body.model)
        chat = chat_request(body, request.headers, model=info.served_model_name, request_id=request_id,
                            strip=strip_preamble(request.headers, self._strip))
        annotate_span(chat)
        return public, chat

    async def count_tokens(self, request: Request) -> Response:
        body = await self._body(request, CountTokensRequest)
        _, chat = await self._convert(body, request, "count-" + uuid.uuid4().hex)
        reply = await self._parse.tokenize(parse_pb2.TokenizeRequest(chat=chat))
        return JSONResponse({"input_tokens": len(reply.token_ids)})

    async def messages(self, request: Request) -> Response:
        body = await self._body(request, MessagesRequest)
        message_id = "msg_" + uuid.uuid4().hex
        public, chat = await self._convert(body, request, message_id)
        verdicts = self._signer.verdicts(thinking_blocks(body))
        if verdicts and set(verdicts) != {"valid"}:
            log.info("gateway.anthropic.thinking_signatures", request_id=message_id, verdicts=dict(verdicts))
        encoder = MessageEncoder(message_id, public, self._signer)
        if body.stream:
            return await self._stream(chat, encoder)
        return await cancel_on_disconnect(request, self._complete(chat, encoder))

    async def _complete(self, chat: chat_pb2.ChatRequest, encoder: MessageEncoder) -> Response:
        assembler = MessageAssembler()
        async with contextlib.aclosing(self._parse.chat(chat)) as stream:
            async for batch in stream:
                assembler.feed(encoder.feed(batch))
                if encoder.error is not None:
                    return error_response(encoder.error)
        return JSONResponse(assembler.message)

    async def _stream(self, chat: chat_pb2.ChatRequest, encoder: MessageEncoder) -> Response:
        stream = self._parse.chat(chat)
        first = await first_frame(stream)
        head = encoder.feed(first)
        if encoder.error is not None:
            await stream.aclose()
            return error_response(encoder.error)
        return EventStreamResponse(self._sse(head, stream, encoder), on_close=stream.aclose)

    async def _sse(
        self, head: list[Event], stream: AsyncGenerator[chat_pb2.ChatEventBatch, None], encoder: MessageEncoder
    ) -> AsyncIterator[bytes]:
        yield sse_events(head)
        pending: asyncio.Future[chat_pb2.ChatEventBatch] | None = None
        try:
            while not encoder.finished:
                if pending is None:
                    pending = asyncio.ensure_future(anext(stream))
                done, _ = await asyncio.wait({pending}, timeout=self._ping_interval)
                if not done:
                    yield PING  # a long gap (prefill of a parallel request, a slow step): keep the client waiting
                    continue
                try:
                    batch = pending.result()
                except StopAsyncIteration:
                    break
                pending = None
                events = encoder.feed(batch)
                if events:
                    yield sse_events(events)
                if encoder.error is not None:
                    yield sse_error(encoder.error)
                    return
            if not encoder.finished:
                raise RuntimeError("the parse stream ended without a finish event")
        except Exception as exc:  # after the first byte every failure goes in-band
            yield sse_error(exc)
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending
