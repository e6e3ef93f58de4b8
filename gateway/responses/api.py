"""``POST /v1/responses``: the OpenAI Responses API, streaming (typed SSE events) and non-streaming."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.errors import error_response
from gateway.handler_util import annotate_span, cancel_on_disconnect, first_frame, read_json
from gateway.parse_client import ParseClient
from gateway.responses.convert import Converted, chat_request
from gateway.responses.events import ResponseEncoder, new_id
from gateway.responses.models import ResponsesRequest
from gateway.responses.store import ResponseStore
from gateway.sse import EventStreamResponse
from services.api import chat_pb2
from services.common import errors

ENCRYPTED_REASONING = "reasoning.encrypted_content"


def sse_events(events: Iterable[dict[str, Any]]) -> bytes:
    """Responses API framing: ``event: TYPE`` + ``data: JSON`` per event, all in one write."""
    return b"".join(
        f"event: {e['type']}\ndata: ".encode() + json.dumps(e, separators=(",", ":")).encode() + b"\n\n"
        for e in events
    )


def _skeleton(body: ResponsesRequest, raw: dict[str, Any], response_id: str, model: str) -> dict[str, Any]:
    """The request echo every ``response`` object carries."""
    reasoning = body.reasoning
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {},
        "output": [],
        "parallel_tool_calls": body.parallel_tool_calls,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": reasoning.effort if reasoning else None,
                      "summary": reasoning.summary if reasoning else None},
        "store": body.store,
        "temperature": body.temperature if body.temperature is not None else 1.0,
        "text": {"format": {"type": "text"}, **(raw.get("text") or {})},
        "tool_choice": raw.get("tool_choice") or "auto",
        "tools": raw.get("tools") or [],
        "top_p": body.top_p if body.top_p is not None else 1.0,
        "truncation": "disabled",
        "usage": None,
        "user": body.user,
    }


class ResponsesApi:
    """The Responses endpoint over a ``ParseClient`` and a ``ResponseStore``."""

    def __init__(self, parse: ParseClient, store: ResponseStore) -> None:
        self._parse = parse
        self._store = store

    async def create(self, request: Request) -> Response:
        raw = await read_json(request)
        body = ResponsesRequest.model_validate(raw)
        public, info = await self._parse.resolve_model(body.model)
        history: tuple[chat_pb2.Message, ...] = ()
        if body.previous_response_id:
            stored = self._store.get(body.previous_response_id)
            if stored is None:
                raise errors.InvalidRequestError(
                    f"Previous response with id '{body.previous_response_id}' not found "
                    f"(this server keeps responses in memory for {self._store.ttl:g} s).",
                    param="previous_response_id",
                )
            history = stored.conversation
        response_id = new_id("resp")
        converted = chat_request(body, request.headers, history, model=info.served_model_name,
                                 request_id=response_id)
        annotate_span(converted.chat)
        include = set(body.include or ())
        encoder = ResponseEncoder(_skeleton(body, raw, response_id, public), converted.tools,
                                  include_encrypted=ENCRYPTED_REASONING in include)
        if body.stream:
            return await self._stream(body, converted, encoder)
        return await cancel_on_disconnect(request, self._complete(body, converted, encoder))

    def _remember(self, body: ResponsesRequest, converted: Converted, encoder: ResponseEncoder,
                  response: dict[str, Any]) -> None:
        if body.store:
            self._store.put(response["id"], [*converted.history, encoder.assistant_message()], response)

    async def _complete(self, body: ResponsesRequest, converted: Converted, encoder: ResponseEncoder) -> Response:
        async with contextlib.aclosing(self._parse.chat(converted.chat)) as stream:
            async for batch in stream:
                encoder.feed(batch)
                if encoder.error is not None:
                    raise encoder.error
        encoder.close()
        response = encoder.response(encoder.status)
        self._remember(body, converted, encoder, response)
        return JSONResponse(response)

    async def _stream(self, body: ResponsesRequest, converted: Converted, encoder: ResponseEncoder) -> Response:
        stream = self._parse.chat(converted.chat)
        first = await first_frame(stream)
        head = encoder.start() + encoder.feed(first)
        if encoder.error is not None:
            await stream.aclose()
            return error_response(encoder.error)
        return EventStreamResponse(self._sse(head, stream, body, converted, encoder), on_close=stream.aclose)

    async def _sse(
        self,
        head: list[dict[str, Any]],
        stream: AsyncGenerator[chat_pb2.ChatEventBatch, None],
        body: ResponsesRequest,
        converted: Converted,
        encoder: ResponseEncoder,
    ) -> AsyncIterator[bytes]:
        yield sse_events(head)
        try:
            async for batch in stream:
                events = encoder.feed(batch)
                if encoder.error is not None:
                    yield sse_events([*events, *encoder.fail(encoder.error)])
                    return
                if events:
                    yield sse_events(events)
        except Exception as exc:  # after the first byte every failure goes in-band
            yield sse_events(encoder.fail(exc))
            return
        tail = encoder.close()
        self._remember(body, converted, encoder, tail[-1]["response"])
        yield sse_events(tail)
