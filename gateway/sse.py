"""Server-sent events: framing, and a streaming response that always releases its upstream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

DONE = b"data: [DONE]\n\n"


def sse_frames(payloads: Iterable[dict[str, Any]]) -> bytes:
    """Several ``data:`` events in one write."""
    return b"".join(b"data: " + json.dumps(p, separators=(",", ":")).encode() + b"\n\n" for p in payloads)


class EventStreamResponse(StreamingResponse):
    """A ``text/event-stream`` response that awaits ``on_close`` however the response ends.

    Starlette cancels the body iterator when the client disconnects; ``on_close`` also covers a
    disconnect before the iterator ever started, so the upstream gRPC call is always cancelled.
    """

    def __init__(self, content: AsyncIterable[bytes], on_close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()
