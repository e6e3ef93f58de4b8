"""Many request streams over one long-lived gRPC stream per peer (``harnessmesh.v1.Mux/Session``).

A gRPC message costs ~0.1 ms of CPU in Python (both ends together) whatever its size, and a call
costs ~0.45 ms more: relaying a 64-token stream frame by frame over three hops cost more than the
rest of the mesh together. On a mux session each side writes batches instead: every frame pending
for any stream goes out in one message, so a busy peer pays once per engine step rather than once per
request per step, and no request pays a call setup.

Server side, :class:`MuxServer` runs the servicers' own stream handlers (``async def
Method(request, context)`` generators) for the streams a client opens. A stream may have one frame
waiting for the session's writer: its handler resumes after that frame is written, so whatever the
engine produces meanwhile is read as one output (the engines' output buffers coalesce tokens until
read) rather than queued frame by frame.

Client side, :meth:`MuxChannel.unary_stream` gives a callable like ``grpc.aio.Channel.unary_stream``'s:
each call is a :class:`MuxCall` that reads like a ``grpc.aio.UnaryStreamCall`` (``read``, ``async
for``, ``cancel``, ``AioRpcError`` with the server's status). Each stream carries the caller's trace
context (W3C ``traceparent`` and baggage) in its open frame, so a stream's spans join the caller's
trace as they did per call. A session that fails (the peer died or restarted) fails every stream open
on it with the session's status; the next stream opens a new session.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc
import structlog
from google.protobuf.message import Message
from opentelemetry import context as otel_context
from opentelemetry import propagate

from services.api import mux_pb2, mux_pb2_grpc, worker_pb2

log = structlog.get_logger()

Response = TypeVar("Response", bound=Message)
Handler = Callable[[Any, Any], AsyncIterator[Message]]

SERVICE_NAME = "harnessmesh.v1.Mux"
# Least time between two batches of plain frames on a session (the services' --stream-linger-ms): 500 batches/s
# at most per peer. A gRPC message costs ~0.1-0.25 ms of CPU in Python, both ends together, whatever it holds,
# so when an engine steps faster than this (the mocker; a small model) a longer linger carries more steps per
# message. 0.5 ms, which uvloop's whole-millisecond timers made ~1 ms, against 2 ms, two meshes side by side:
# 1,024-token outputs at concurrency 8 +25 % tokens/s (-14 % CPU per request), short requests at concurrency 8
# +12 % requests/s (-15 % CPU), at concurrency 1 -2..-13 % CPU; TTFT unchanged (a first frame never waits).
DEFAULT_LINGER = 0.002
# A server with open streams writes at least every HEARTBEAT seconds (an empty batch when it has nothing
# else); a client whose open streams heard nothing for LIVENESS seconds fails them UNAVAILABLE: a hung
# peer (SIGSTOP, a blocked loop) costs its streams about a second, and they go elsewhere.
HEARTBEAT = 0.25
LIVENESS = 1.0


def method_name(service: str, method: str) -> str:
    """The full gRPC method name a stream is opened with, e.g. ``/harnessmesh.v1.Router/Generate``."""
    return f"/harnessmesh.v1.{service}/{method}"


class _Outbox:
    """Frames waiting for a session's writer, taken all at once.

    :meth:`send` waits until the batch holding its frame was written (one frame in flight per
    stream); :meth:`post` does not (open, cancel and end frames). With ``linger`` > 0 a batch of
    plain frames is taken no sooner than ``linger`` seconds after the previous one, so a session
    sends at most ``1 / linger`` batches a second however fast its streams produce (an engine
    stepping every few milliseconds never waits); an urgent frame (a stream's first message, its
    end, an open or a cancel) is taken at once, with everything waiting beside it.
    """

    def __init__(self, linger: float = 0.0) -> None:
        self._loop = asyncio.get_running_loop()
        self._linger = linger
        self._frames: list[mux_pb2.MuxFrame] = []
        self._urgent = False
        self._lingering = False
        self._wake: asyncio.Future[None] | None = None
        self._written: asyncio.Future[None] = self._loop.create_future()
        self._last_take = float("-inf")
        self._closed = False

    def post(self, frame: mux_pb2.MuxFrame, *, urgent: bool = True) -> None:
        self._frames.append(frame)
        self._urgent = self._urgent or urgent
        self._notify(urgent)

    async def send(self, frame: mux_pb2.MuxFrame, *, urgent: bool = False) -> None:
        if self._closed:
            raise asyncio.CancelledError
        self.post(frame, urgent=urgent)
        await asyncio.shield(self._written)

    def close(self) -> None:
        self._closed = True
        self._notify(True)

    def _notify(self, urgent: bool) -> None:
        wake = self._wake
        if wake is not None and not wake.done() and (urgent or not self._lingering):
            wake.set_result(None)

    def _linger_over(self) -> None:
        self._notify(True)

    async def take(self, idle: float | None = None) -> tuple[list[mux_pb2.MuxFrame], asyncio.Future[None]] | None:
        """Every frame waiting (waits for one, see the class docstring) and the future to resolve
        once they are written; no frames after ``idle`` seconds with nothing to send; ``None`` once closed."""
        idle_at = None if idle is None else self._loop.time() + idle
        while True:
            timer: asyncio.TimerHandle | None = None
            if self._frames:
                wait = 0.0 if self._urgent or self._closed else self._last_take + self._linger - self._loop.time()
                if wait <= 0:
                    break
                timer = self._loop.call_later(wait, self._linger_over)
            elif self._closed:
                return None
            elif idle_at is not None:
                if self._loop.time() >= idle_at:
                    return [], self._loop.create_future()
                timer = self._loop.call_at(idle_at, self._linger_over)
            self._lingering = bool(self._frames) and timer is not None
            self._wake = self._loop.create_future()
            try:
                await self._wake
            finally:
                self._wake = None
                if timer is not None:
                    timer.cancel()
        frames, self._frames = self._frames, []
        self._urgent = False
        self._last_take = self._loop.time()
        written, self._written = self._written, self._loop.create_future()
        return frames, written


# --- server -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MuxMethod:
    """A stream method served over mux sessions: the servicer's handler and its request type."""

    handler: Handler
    request_type: type[Message]


class MuxContext:
    """What a stream handler may use of a ``grpc.aio.ServicerContext`` on a mux stream."""

    def __init__(self, metadata: Mapping[str, str], peer: str) -> None:
        self._metadata = metadata
        self._peer = peer
        self.code = grpc.StatusCode.OK
        self.details = ""
        self.trailing: tuple[tuple[str, str], ...] = ()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return tuple(self._metadata.items())

    def peer(self) -> str:
        return self._peer

    def set_trailing_metadata(self, metadata: Iterable[tuple[str, str]]) -> None:
        self.trailing = tuple(metadata)

    async def abort(self, code: grpc.StatusCode, details: str = "",
                    trailing_metadata: Sequence[tuple[str, str]] = ()) -> None:
        self.code, self.details = code, details
        if trailing_metadata:
            self.trailing = tuple(trailing_metadata)
        raise grpc.aio.AbortError()


class _ServerSession:
    """One client's session: a task per open stream, one outbox for the writer."""

    def __init__(self, methods: Mapping[str, MuxMethod], peer: str, linger: float,
                 accepting: Callable[[], bool] = lambda: True) -> None:
        self.outbox = _Outbox(linger)
        self._methods = methods
        self._peer = peer
        self._accepting = accepting
        self._tasks: dict[int, asyncio.Task[None]] = {}

    @property
    def has_streams(self) -> bool:
        return bool(self._tasks)

    async def read(self, requests: AsyncIterator[mux_pb2.MuxBatch]) -> None:
        try:
            async for batch in requests:
                for frame in batch.frames:
                    kind = frame.WhichOneof("kind")
                    if kind == "open":
                        self._open(frame.stream, frame.open)
                    elif kind == "cancel":
                        task = self._tasks.pop(frame.stream, None)
                        if task is not None:
                            task.cancel()
        finally:
            self.cancel_all()
            self.outbox.close()

    def cancel_all(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()

    def _open(self, stream: int, request: mux_pb2.MuxOpen) -> None:
        if stream in self._tasks:
            return
        if not self._accepting():  # draining: the client tries another server (UNAVAILABLE before any frame)
            self.outbox.post(mux_pb2.MuxFrame(stream=stream, end=mux_pb2.MuxEnd(
                code=grpc.StatusCode.UNAVAILABLE.value[0], details="the server is shutting down")))
            return
        self._tasks[stream] = asyncio.create_task(self._run(stream, request), name=f"mux-{request.method}")

    async def _run(self, stream: int, request: mux_pb2.MuxOpen) -> None:
        context = MuxContext(request.metadata, self._peer)
        token = otel_context.attach(propagate.extract(request.metadata))
        try:
            method = self._methods.get(request.method)
            if method is None:
                await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"no mux method {request.method}")
                return
            message = method.request_type.FromString(request.request)
            first = True
            async for response in method.handler(message, context):
                await self.outbox.send(mux_pb2.MuxFrame(stream=stream, message=response.SerializeToString()),
                                       urgent=first)
                first = False
        except grpc.aio.AbortError:
            pass
        except asyncio.CancelledError:
            return  # the client left: it expects nothing more
        except Exception as exc:  # as grpc does for a handler that raises: UNKNOWN with the exception
            log.exception("mux.handler_failed", method=request.method)
            context.code, context.details = grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}"
        finally:
            self._tasks.pop(stream, None)
            otel_context.detach(token)
        self.outbox.post(mux_pb2.MuxFrame(stream=stream, end=mux_pb2.MuxEnd(
            code=context.code.value[0], details=context.details, trailing=dict(context.trailing))))


class MuxServer(mux_pb2_grpc.MuxServicer):
    """Serves ``methods`` (full method name -> :class:`MuxMethod`) over mux sessions; ``linger``: the
    least time between two batches of plain frames on a session (see :class:`_Outbox`)."""

    def __init__(self, methods: Mapping[str, MuxMethod], linger: float = DEFAULT_LINGER) -> None:
        self._methods = dict(methods)
        self._linger = linger
        self._sessions: set[_ServerSession] = set()
        self._draining = False

    async def drain(self, timeout: float) -> bool:
        """Refuse new streams (UNAVAILABLE: the client goes elsewhere) and wait up to ``timeout`` s for the open
        ones to end; True when they all did. Sessions stay up meanwhile: their streams keep flowing."""
        self._draining = True
        deadline = asyncio.get_running_loop().time() + timeout
        while any(session.has_streams for session in self._sessions):
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.01)
        for session in self._sessions:  # nothing open: end the sessions (their last frames are still written)
            session.outbox.close()
        return True

    async def Session(  # type: ignore[override]
        self, request_iterator: AsyncIterator[mux_pb2.MuxBatch], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[mux_pb2.MuxBatch]:
        session = _ServerSession(self._methods, context.peer(), self._linger, lambda: not self._draining)
        self._sessions.add(session)
        reader = asyncio.create_task(session.read(request_iterator), name="mux-session-reader")
        try:
            while (taken := await session.outbox.take(idle=HEARTBEAT)) is not None:
                frames, written = taken
                if not frames and not session.has_streams:
                    continue  # idle: a heartbeat only tells waiting streams the peer is alive
                yield mux_pb2.MuxBatch(frames=frames)
                written.set_result(None)
        finally:
            self._sessions.discard(session)
            reader.cancel()
            session.cancel_all()


def add_mux_server(server: grpc.aio.Server, methods: Mapping[str, MuxMethod],
                   linger: float = DEFAULT_LINGER) -> MuxServer:
    mux = MuxServer(methods, linger)
    mux_pb2_grpc.add_MuxServicer_to_server(mux, server)
    return mux


# --- client -------------------------------------------------------------------------------------

_STATUS_BY_VALUE = {status.value[0]: status for status in grpc.StatusCode}


def rpc_error(code: grpc.StatusCode, details: str, trailing: Mapping[str, str] | None = None) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*(trailing or {}).items()), details)


class MuxCall(Generic[Response]):
    """One stream on a session, read like a ``grpc.aio.UnaryStreamCall``."""

    def __init__(self, session: _ClientSession, stream: int, decode: Callable[[bytes], Response],
                 timeout: float | None) -> None:
        self._session = session
        self._stream = stream
        self._decode = decode
        self._messages: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        self._error: grpc.aio.AioRpcError | None = None
        self._timer = asyncio.get_running_loop().call_later(timeout, self._expire) if timeout else None

    async def read(self) -> Response | Any:
        """The next message; ``grpc.aio.EOF`` after the last; raises the stream's ``AioRpcError``."""
        while not self._messages:
            if self._ended:
                if self._error is not None:
                    raise self._error
                return grpc.aio.EOF
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._decode(self._messages.popleft())

    async def __aiter__(self) -> AsyncIterator[Response]:
        while (message := await self.read()) is not grpc.aio.EOF:
            yield message

    def cancel(self) -> bool:
        """Leave the stream (the server's handler is cancelled); False when it had ended already."""
        if self._ended:
            return False
        self._finish(rpc_error(grpc.StatusCode.CANCELLED, "Locally cancelled by application!"))
        self._session.cancel(self._stream)
        return True

    def done(self) -> bool:
        return self._ended

    # called by the session
    def deliver(self, message: bytes) -> None:
        self._messages.append(message)
        self._wake()

    def end(self, end: mux_pb2.MuxEnd) -> None:
        code = _STATUS_BY_VALUE.get(end.code, grpc.StatusCode.UNKNOWN)
        self._finish(None if code == grpc.StatusCode.OK else rpc_error(code, end.details, end.trailing))

    def fail(self, error: grpc.aio.AioRpcError) -> None:
        if not self._ended:
            self._finish(error)

    def _expire(self) -> None:
        if not self._ended:
            self._finish(rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
            self._session.cancel(self._stream)

    def _finish(self, error: grpc.aio.AioRpcError | None) -> None:
        self._ended = True
        self._error = error
        if error is not None:
            self._messages.clear()
        if self._timer is not None:
            self._timer.cancel()
        self._session.forget(self._stream)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


def _session_lost(exc: grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
    """A failed session as its streams see it: the peer is unavailable (a server never ends a session on
    purpose; grpc reports a broken one as UNAVAILABLE, CANCELLED or a core INTERNAL error on a write)."""
    if exc.code() == grpc.StatusCode.UNAVAILABLE:
        return exc
    return rpc_error(grpc.StatusCode.UNAVAILABLE, f"the mux session was lost: {exc.code().name} {exc.details()}")


class _ClientSession:
    """One ``Mux/Session`` call: a writer task for open/cancel frames, a reader task for the rest."""

    def __init__(self, stub: mux_pb2_grpc.MuxStub, liveness: float = LIVENESS) -> None:
        self.closed = False
        self.batches_read = 0  # gRPC messages received (each a batch of frames)
        self._loop = asyncio.get_running_loop()
        self._liveness = liveness
        self._last_heard = self._loop.time()
        self._call = stub.Session()
        self._outbox = _Outbox()
        self._streams: dict[int, MuxCall[Any]] = {}
        self._ids = itertools.count(1)
        self._tasks = (asyncio.create_task(self._write(), name="mux-session-writer"),
                       asyncio.create_task(self._read(), name="mux-session-reader"),
                       asyncio.create_task(self._watch(), name="mux-session-watchdog"))

    def open(self, method: str, request: bytes, decode: Callable[[bytes], Response],
             timeout: float | None) -> MuxCall[Response]:
        stream = next(self._ids)
        if not self._streams:
            self._last_heard = self._loop.time()  # the peer owes us nothing while no stream is open
        call = MuxCall(self, stream, decode, timeout)
        self._streams[stream] = call
        metadata: dict[str, str] = {}
        propagate.inject(metadata)
        self._outbox.post(mux_pb2.MuxFrame(stream=stream, open=mux_pb2.MuxOpen(
            method=method, request=request, metadata=metadata, timeout=timeout or 0.0)))
        return call

    def cancel(self, stream: int) -> None:
        if not self.closed:
            self._outbox.post(mux_pb2.MuxFrame(stream=stream, cancel=mux_pb2.MuxCancel()))

    def forget(self, stream: int) -> None:
        self._streams.pop(stream, None)

    async def close(self) -> None:
        self._fail(rpc_error(grpc.StatusCode.CANCELLED, "the channel was closed"))
        self._call.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _write(self) -> None:
        try:
            while (taken := await self._outbox.take()) is not None:
                frames, written = taken
                await self._call.write(mux_pb2.MuxBatch(frames=frames))
                written.set_result(None)
        except grpc.aio.AioRpcError as exc:
            self._fail(_session_lost(exc))
        except asyncio.InvalidStateError:  # the call ended under the writer; the reader reports why
            pass

    async def _read(self) -> None:
        try:
            while True:
                batch = await self._call.read()
                if batch is grpc.aio.EOF:
                    break
                self.batches_read += 1
                self._last_heard = self._loop.time()
                streams = self._streams
                for frame in batch.frames:
                    call = streams.get(frame.stream)
                    if call is None:
                        continue  # cancelled here; its last frames were in flight
                    if frame.WhichOneof("kind") == "message":
                        call.deliver(frame.message)
                    else:
                        call.end(frame.end)
        except grpc.aio.AioRpcError as exc:
            self._fail(_session_lost(exc))
            return
        self._fail(rpc_error(grpc.StatusCode.UNAVAILABLE, "the peer ended the mux session"))

    async def _watch(self) -> None:
        while not self.closed:
            await asyncio.sleep(self._liveness / 4)
            silent = self._loop.time() - self._last_heard
            if self._streams and silent > self._liveness:
                self._fail(rpc_error(grpc.StatusCode.UNAVAILABLE,
                                     f"the peer sent nothing for {silent:.1f} s with streams open (hung?)"))
                self._call.cancel()
                return

    def _fail(self, error: grpc.aio.AioRpcError) -> None:
        if self.closed:
            return
        self.closed = True
        self._outbox.close()
        for call in list(self._streams.values()):
            call.fail(error)
        self._streams.clear()


class MuxChannel:
    """A peer's channel for mux streams: one session at a time, opened on the first stream.

    The channel has no tracing interceptors: a session outlives any one request, so each stream
    carries the caller's trace context in its open frame instead.
    """

    def __init__(self, target: str, options: Sequence[tuple[str, Any]] = (),
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        self.target = target
        self._channel = (grpc.aio.secure_channel(target, credentials, options=options) if credentials is not None
                         else grpc.aio.insecure_channel(target, options=options))
        self._stub = mux_pb2_grpc.MuxStub(self._channel)
        self._session: _ClientSession | None = None

    def unary_stream(self, method: str, decode: Callable[[bytes], Response]) -> MuxStreamCallable[Response]:
        return MuxStreamCallable(self, method, decode)

    def open(self, method: str, request: Message, decode: Callable[[bytes], Response],
             timeout: float | None = None) -> MuxCall[Response]:
        session = self._session
        if session is None or session.closed:
            session = self._session = _ClientSession(self._stub)
        return session.open(method, request.SerializeToString(), decode, timeout)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self._channel.close()


class MuxStreamCallable(Generic[Response]):
    """``callable(request, timeout=None) -> MuxCall``: one method of a :class:`MuxChannel`."""

    def __init__(self, channel: MuxChannel, method: str, decode: Callable[[bytes], Response]) -> None:
        self._channel = channel
        self._method = method
        self._decode = decode

    def __call__(self, request: Message, *, timeout: float | None = None) -> MuxCall[Response]:
        return self._channel.open(self._method, request, self._decode, timeout)


class GenerateStub:
    """``Generate`` of the Router or the Worker service (one contract) on a mux channel, shaped like
    their generated stubs' method."""

    def __init__(self, channel: MuxChannel, service: str) -> None:
        self.channel = channel
        self._method = method_name(service, "Generate")

    def Generate(
        self, request: worker_pb2.GenerateRequest, *, timeout: float | None = None
    ) -> MuxCall[worker_pb2.GenerateResponse]:
        return self.channel.open(self._method, request, worker_pb2.GenerateResponse.FromString, timeout)
