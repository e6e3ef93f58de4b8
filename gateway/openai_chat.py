"""``POST /v1/chat/completions``: streaming (SSE chunks) and non-streaming."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Mapping
from typing import Any

from opentelemetry import trace
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.errors import error_response, sse_error
from gateway.openai_convert import chat_request
from gateway.openai_events import DISPATCH_EVENT, Aggregator, ChunkEncoder
from gateway.openai_models import ChatCompletionRequest
from gateway.parse_client import ParseClient
from gateway.sse import DONE, EventStreamResponse, sse_frames
from services.api import chat_pb2
from services.common import errors


async def read_json(request: Request) -> Any:
    """The request body as JSON; malformed JSON is a 400."""
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise errors.InvalidRequestError(f"request body is not valid JSON: {exc}") from exc


def annotate_span(request: chat_pb2.ChatRequest) -> None:
    """Put who-and-what attributes on the request's root span."""
    span = trace.get_current_span()
    span.set_attribute("gen_ai.request.model", request.model)
    span.set_attribute("model", request.model)
    span.set_attribute("request.id", request.request_id)
    span.set_attribute("session.id", request.identity.session_id)
    span.set_attribute("trajectory.id", request.identity.trajectory_id)
    span.set_attribute("harness.name", request.identity.harness)


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
        return await _cancel_on_disconnect(request, self._complete(chat, completion_id, public, created))

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
        # Wait for the first frame so that errors found before any output keep their HTTP status.
        try:
            first = await anext(stream)
        except StopAsyncIteration:
            first = chat_pb2.ChatEventBatch()
        except BaseException:
            await stream.aclose()
            raise
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


async def _cancel_on_disconnect(request: Request, work: Coroutine[Any, Any, Response]) -> Response:
    """Run ``work`` (a non-streaming request) but cancel it, and the parse call, if the client leaves."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        return error_response(errors.CancelledError("the client went away"))
    return task.result()


def _headers(request: Request) -> Mapping[str, str]:
    return request.headers
