"""What every HTTP API handler shares: reading the body, the root span's attributes, the first frame
of a stream, and cancelling a non-streaming request when its client goes away."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Coroutine
from typing import Any

from opentelemetry import trace
from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import error_response
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


async def first_frame(stream: AsyncGenerator[chat_pb2.ChatEventBatch, None]) -> chat_pb2.ChatEventBatch:
    """The stream's first frame, read before any byte goes out so early errors keep their HTTP status.

    On failure the stream is closed (cancelling the parse call) and the error propagates.
    """
    try:
        return await anext(stream)
    except StopAsyncIteration:
        return chat_pb2.ChatEventBatch()
    except BaseException:
        await stream.aclose()
        raise


async def cancel_on_disconnect(request: Request, work: Coroutine[Any, Any, Response]) -> Response:
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
        return error_response(errors.RequestCancelledError("the client went away"))
    return task.result()
