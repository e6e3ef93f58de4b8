"""The one endpoint helper of the three HTTP chat APIs: from the parse stream to a response.

An API supplies a :class:`TurnEncoder` (its ``encode.py``: frames from a ``TurnFold``) and a
:class:`Framing` (how its frames are written as server-sent events); :class:`TurnEndpoint` does the
rest the same way for every API:

- streaming: the parse service's first frame is read before any byte goes out, so early failures
  (unknown model, no worker, prompt too long, an error event in the first frame) raise and become an
  HTTP status at the app's error boundary. Then one SSE write per batch through one JSON encoder,
  the API's keep-alive frame after ``keep_alive_interval`` of silence (Anthropic's ``ping``), and
  after the first byte every failure in-band (``TurnEncoder.fail``, after ``public_error``).
  The response always closes the parse stream, which cancels the parse call.
- non-streaming: the same encoder folds the whole stream, ``reply()`` is the body; the work is
  cancelled, and with it the parse call, when the client goes away.

Also here: what every chat handler does first (JSON body, root-span attributes).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.boundary import public_error, request_id_of
from gateway.turn import TurnFold
from gateway.turn_tracking import annotate_chat_span
from services.api import chat_pb2
from services.common import errors
from services.common.service_settings import INLINE_BODY_BYTES, INLINE_BODY_MESSAGES

Frame = dict[str, Any]
ParseStream = AsyncGenerator[chat_pb2.ChatEventBatch, None]


# -- before the turn ------------------------------------------------------------------------------


# Deepest JSON nesting a request body may have: far beyond any real request (a tool schema inside a tool
# inside a body is ~10) and short of the recursion limit the stdlib encoder hits when a converter writes a
# nested field back as JSON text (orjson parses up to 1,024 levels). It is orjson's own encoding limit,
# which makes the check one C-speed ``orjson.dumps``.
MAX_JSON_DEPTH = 254


Result = TypeVar("Result")
Model = TypeVar("Model", bound=BaseModel)


@dataclass(frozen=True)
class JsonBody:
    """A request's JSON body (``value``) and the name of its list of messages or input items (``items``);
    ``large``: over ``INLINE_BODY_BYTES`` or ``INLINE_BODY_MESSAGES`` items, so its work runs off the event
    loop (:meth:`run`; the validation and conversion of 10,000 tiny messages take ~0.18 s)."""

    value: Any
    large: bool
    items: str = ""

    async def run(self, work: Callable[[], Result]) -> Result:
        """``work()``: in a worker thread for a large body (the loop serves other requests meanwhile), else
        here. Whatever ``work`` touches that outlives the request must be safe across threads."""
        return await asyncio.to_thread(work) if self.large else work()

    async def validate(self, model: type[Model]) -> Model:
        """The body as ``model`` (:func:`validate_body`), off the loop when large."""
        return await self.run(lambda: validate_body(model, self))


# Items pydantic validates in one call when a large body is validated in a thread: one call holds the GIL,
# and with it the event loop, for all its items (~3 ms per 1,000 small messages here, 0.03-0.14 s for 10,000).
VALIDATE_CHUNK = 256


def validate_body(model: type[Model], body: JsonBody) -> Model:
    """``model.model_validate(body.value)``. A large body's ``items`` list is validated ``VALIDATE_CHUNK`` items
    at a time (the thread lets go of the GIL between chunks); the rest of the body, and the list's own
    constraints, with its first item. An invalid item is reported as one call reports it (that call
    raises). ``model`` must not validate across items."""
    raw, items = body.value, body.items
    listed = raw.get(items) if items and isinstance(raw, dict) else None
    if not body.large or not isinstance(listed, list) or len(listed) <= VALIDATE_CHUNK:
        return model.model_validate(raw)
    head = model.model_validate({**raw, items: listed[:1]})
    adapter = _items_adapter(model, items)
    validated = list(getattr(head, items))
    for start in range(1, len(listed), VALIDATE_CHUNK):
        try:
            validated.extend(adapter.validate_python(listed[start : start + VALIDATE_CHUNK]))
        except ValidationError:
            return model.model_validate(raw)  # raises: the errors one call gives (a bad body's cost is its own)
    return head.model_copy(update={items: validated})


@functools.lru_cache(maxsize=32)
def _items_adapter(model: type[BaseModel], items: str) -> TypeAdapter[list[Any]]:
    return TypeAdapter(model.model_fields[items].annotation)  # type: ignore[arg-type]


async def read_json(request: Request, *, items: str = "", max_items: int = 0) -> JsonBody:
    """The request body as JSON; malformed JSON is a 400. Strict JSON (``orjson``): lone UTF-16 surrogates,
    NaN / Infinity and numbers that overflow a double are refused here with the parser's message, and so
    is nesting deeper than :data:`MAX_JSON_DEPTH` levels, never a 500 further on.

    ``items``, ``max_items``: the body's list of messages (or input items) holds at most ``max_items``
    (``--max-messages``; 0: any number), else a 400 before anything validates or converts it. A body over
    either ``INLINE_BODY_*`` limit is ``large``. It is parsed here all the same: orjson holds the GIL
    throughout (~2 ms a MB), so a thread would free nothing and add a hand-off."""
    body = await request.body()
    large = len(body) > INLINE_BODY_BYTES
    value = _loads(body)
    listed = value.get(items) if items and isinstance(value, dict) else None
    if isinstance(listed, list):
        if max_items and len(listed) > max_items:
            raise errors.InvalidRequestError(
                f"{items} has {len(listed)} items; at most {max_items} are accepted (--max-messages)", param=items)
        large = large or len(listed) > INLINE_BODY_MESSAGES
    return JsonBody(value, large, items)


def _loads(body: bytes) -> Any:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise errors.InvalidRequestError(f"request body is not valid JSON: {exc}") from exc
    try:
        # What orjson.loads returns it can write, unless it nests too deeply. Cheaper than counting the
        # body's brackets first (~0.04 ms vs ~0.2 ms for a 240 KB body; a few microseconds for a small one).
        orjson.dumps(value)
    except orjson.JSONEncodeError:
        raise errors.InvalidRequestError(
            f"request body nests deeper than {MAX_JSON_DEPTH} levels", param="body") from None
    return value


def annotate_span(request: chat_pb2.ChatRequest) -> None:
    """Make the request's root span the turn's ``chat {model}`` span with its who-and-what attributes, before
    admission (a turn refused in the queue still shows whose it was); see ``turn_tracking.annotate_chat_span``."""
    annotate_chat_span(request)


# -- server-sent events ---------------------------------------------------------------------------


def dumps(payload: Frame) -> bytes:
    """The one JSON encoding of every SSE frame: compact, UTF-8 (like starlette's ``JSONResponse``).

    orjson writes the same bytes as ``json.dumps(separators=(",", ":"), ensure_ascii=False)`` for the
    frames we build, several times faster; what it refuses (an int beyond 64 bits, a non-str key) goes
    through the stdlib encoder.
    """
    try:
        return orjson.dumps(payload)
    except TypeError:
        return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def _unnamed(payload: Frame) -> str | None:
    return None


def _typed(payload: Frame) -> str | None:
    return str(payload["type"])


@dataclass(frozen=True)
class Framing:
    """How an API writes its frames as server-sent events.

    ``event`` names a frame's ``event:`` line (None: a bare ``data:`` line); ``end`` is written after
    the last frame of a stream, error or not (OpenAI's ``data: [DONE]``); ``keep_alive`` is the frame
    sent on a long silence, or None.
    """

    event: Callable[[Frame], str | None] = _unnamed
    end: bytes = b""
    keep_alive: Frame | None = None

    def frames(self, payloads: Iterable[Frame]) -> bytes:
        """Several frames in one write."""
        out = []
        for payload in payloads:
            name = self.event(payload)
            head = b"event: " + name.encode() + b"\n" if name else b""
            out.append(head + b"data: " + dumps(payload) + b"\n\n")
        return b"".join(out)


TYPED = Framing(event=_typed)  # ``event: <type>`` before every frame (Anthropic, Responses)


def typed_events(events: Iterable[Frame]) -> bytes:
    """``event: TYPE`` + ``data: JSON`` per event, all in one write."""
    return TYPED.frames(events)


class EventStreamResponse(StreamingResponse):
    """A ``text/event-stream`` response that awaits ``on_close`` however the response ends.

    A client that disconnects has the body iterator cancelled; ``on_close`` also covers a disconnect
    before the iterator ever started, so the upstream gRPC call is always cancelled. The disconnect
    watch is one plain task that cancels the response's own task, where Starlette (for an ASGI 2.3
    server such as uvicorn) runs an anyio task group: ~0.1 ms of CPU less per streamed response.
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
            if scope["type"] == "http":
                await self._stream_until_disconnect(receive, send)
            else:
                await super().__call__(scope, receive, send)
        finally:
            await self._on_close()

    async def _stream_until_disconnect(self, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        left = False

        async def watch() -> None:
            nonlocal left
            await self.listen_for_disconnect(receive)
            left = True
            task.cancel()

        # cancelled in ``finally`` before it can run again: a disconnect after the last send cancels nothing
        watcher = asyncio.create_task(watch(), name="sse-disconnect-watch")
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            # the client left: the response just ends, as Starlette's does; a cancel from elsewhere goes on
            if not left or task.uncancel() > 0:
                raise
        finally:
            watcher.cancel()


# -- the turn -------------------------------------------------------------------------------------


class TurnEncoder(Protocol):
    """An API's encoder of one turn; it feeds its own ``fold`` and reads it.

    ``start()`` frames before the first batch (streaming only), ``feed()`` a batch's frames,
    ``close()`` the frames of a turn that ended without an error (it may raise: the turn is broken),
    ``fail()`` the in-band frames of an error after the first byte, ``reply()`` the non-streaming body
    (after ``close()``). ``complete``: nothing the stream may still send matters to this API's stream,
    which ends there (Anthropic's ``message_stop``).
    """

    fold: TurnFold

    @property
    def complete(self) -> bool: ...

    def start(self) -> list[Frame]: ...

    def feed(self, batch: chat_pb2.ChatEventBatch) -> list[Frame]: ...

    def close(self) -> list[Frame]: ...

    def fail(self, error: errors.MeshError) -> list[Frame]: ...

    def reply(self) -> Frame: ...


async def first_frame(stream: ParseStream) -> chat_pb2.ChatEventBatch:
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
        raise errors.RequestCancelledError("the client went away")
    return task.result()


async def _paced(stream: ParseStream, interval: float | None) -> AsyncGenerator[chat_pb2.ChatEventBatch | None, None]:
    """The stream's batches, and None after every ``interval`` seconds of silence (no interval: never)."""
    if interval is None:
        async for batch in stream:
            yield batch
        return
    pending: asyncio.Future[chat_pb2.ChatEventBatch] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(stream))
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield None
                continue
            try:
                batch = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield batch
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending


@dataclass(frozen=True)
class TurnEndpoint:
    """Answers a chat request from its parse stream, streaming or not, in one API's framing."""

    framing: Framing
    keep_alive_interval: float = 10.0

    async def respond(
        self,
        request: Request,
        stream: ParseStream,
        encoder: TurnEncoder,
        *,
        streaming: bool,
        on_complete: Callable[[Frame], Awaitable[None]] | None = None,
    ) -> Response:
        """The response to ``request``; ``on_complete`` gets the reply of a turn that ended well."""
        if streaming:
            return await self._stream(request, stream, encoder, on_complete)
        return await cancel_on_disconnect(request, self._complete(stream, encoder, on_complete))

    async def _complete(
        self, stream: ParseStream, encoder: TurnEncoder, on_complete: Callable[[Frame], Awaitable[None]] | None
    ) -> Response:
        async with contextlib.aclosing(stream):
            async for batch in stream:
                encoder.feed(batch)
                if encoder.fold.error is not None:
                    raise encoder.fold.error
        encoder.close()  # read to the end: the parse service finishes its turn (prefix watch) before EOF
        reply = encoder.reply()
        if on_complete is not None:
            await on_complete(reply)
        return JSONResponse(reply)

    async def _stream(
        self, request: Request, stream: ParseStream, encoder: TurnEncoder,
        on_complete: Callable[[Frame], Awaitable[None]] | None,
    ) -> Response:
        first = await first_frame(stream)
        head = encoder.start() + encoder.feed(first)
        if encoder.fold.error is not None:
            await stream.aclose()
            raise encoder.fold.error  # no byte sent yet: an HTTP status
        body = self._body(head, stream, encoder, request_id_of(request), on_complete)
        return EventStreamResponse(body, on_close=stream.aclose)

    async def _body(
        self, head: list[Frame], stream: ParseStream, encoder: TurnEncoder, request_id: str,
        on_complete: Callable[[Frame], Awaitable[None]] | None,
    ) -> AsyncIterator[bytes]:
        framing = self.framing
        yield framing.frames(head)
        interval = self.keep_alive_interval if framing.keep_alive is not None else None
        batches = _paced(stream, interval)
        try:
            async with contextlib.aclosing(batches):
                while not encoder.complete:
                    batch = await anext(batches, _END)
                    if batch is _END:
                        break
                    if batch is None:
                        assert framing.keep_alive is not None
                        yield framing.frames([framing.keep_alive])  # a long gap: keep the client waiting
                        continue
                    frames = encoder.feed(batch)
                    if encoder.fold.error is not None:
                        frames += encoder.fail(public_error(encoder.fold.error, request_id))
                        yield framing.frames(frames) + framing.end
                        return
                    if frames:
                        yield framing.frames(frames)
            tail = encoder.close()
            if on_complete is not None:  # awaited before the last frames: a next request may name this turn
                await on_complete(encoder.reply())
        except Exception as exc:  # after the first byte every failure goes in-band
            yield framing.frames(encoder.fail(public_error(exc, request_id))) + framing.end
            return
        yield framing.frames(tail) + framing.end


_END = chat_pb2.ChatEventBatch()  # sentinel: the stream ended
