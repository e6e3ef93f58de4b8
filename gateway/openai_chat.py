"""``POST /v1/chat/completions``: streaming (SSE chunks) and non-streaming."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.errors import error_response, sse_error
from gateway.handler_util import annotate_span, cancel_on_disconnect, first_frame, read_json
from gateway.openai_convert import chat_request
from gateway.openai_events import DISPATCH_EVENT, Aggregator, ChunkEncoder
from gateway.openai_models import ChatCompletionRequest
from gateway.parse_client import ParseClient
from gateway.sse import DONE, EventStreamResponse, sse_frames
from services.api import chat_pb2


class ChatCompletions:
    """The chat completions endpoint over a ``ParseClient``.

    ``tool_dispatch``: stream each tool call dispatch as an ``event: tool_call_dispatch`` SSE event too.
    """

    def __init__(self, parse: ParseClient, *, tool_dispatch: bool = False) -> None:
        self._parse = parse
        self._tool_dispatch = tool_dispatch

    async def handle(self, request: Request) -> Response:
        body = ChatCompletionRequest.model_validate(await read_json(request))
        public, info = await self._parse.resolve_model(body.model)
        completion_id = "chatcmpl-" + uuid.uuid4().hex
        chat = chat_request(body, _headers(request), model=info.served_model_name, request_id=completion_id)
        annotate_span(chat)
        created = int(time.time())
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            encoder = ChunkEncoder(completion_id, public, created, include_usage=include_usage,
                                   dispatch_events=self._tool_dispatch)
            return await self._stream(chat, encoder)
        return await cancel_on_disconnect(request, self._complete(chat, completion_id, public, created))

    async def _complete(
        self, chat: chat_pb2.ChatRequest, completion_id: str, model: str, created: int
    ) -> Response:
        agg = Aggregator()
        async with contextlib.aclosing(self._parse.chat(chat)) as stream:
            async for batch in stream:
                agg.feed(batch)
                if agg.turn.error is not None:
                    raise agg.turn.error
        return JSONResponse(agg.response(completion_id, model, created))

    async def _stream(self, chat: chat_pb2.ChatRequest, encoder: ChunkEncoder) -> Response:
        stream = self._parse.chat(chat)
        first = await first_frame(stream)
        head = encoder.feed(first)
        if encoder.error is not None:
            await stream.aclose()
            return error_response(encoder.error)
        return EventStreamResponse(_sse(head, stream, encoder), on_close=stream.aclose)


async def _sse(
    head: list[dict[str, Any]], stream: AsyncGenerator[chat_pb2.ChatEventBatch, None], encoder: ChunkEncoder
) -> AsyncIterator[bytes]:
    yield _frames(head)
    try:
        async for batch in stream:
            chunks = encoder.feed(batch)
            if chunks:
                yield _frames(chunks)
            if encoder.error is not None:
                yield sse_error(encoder.error)
                return
    except Exception as exc:  # after the first byte every failure goes in-band
        yield sse_error(exc)
        return
    yield sse_frames(encoder.close()) + DONE


def _frames(chunks: list[dict[str, Any]]) -> bytes:
    """SSE frames of ``chunks``; dispatch chunks go out as the named ``tool_call_dispatch`` event."""
    if not any(DISPATCH_EVENT in c for c in chunks):
        return sse_frames(chunks)
    named = b"event: " + DISPATCH_EVENT.encode() + b"\n"
    return b"".join((named if DISPATCH_EVENT in c else b"") + sse_frames([c]) for c in chunks)


def _headers(request: Request) -> Mapping[str, str]:
    return request.headers
