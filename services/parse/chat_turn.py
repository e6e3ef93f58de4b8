"""One chat turn as the parse service streams it: router frames in, event batches out.

:class:`ChatTurn` is the domain of ``Parse.Chat`` after the prompt is rendered, with no gRPC in it: it
reads any :class:`RouterStream` (the resuming router call in the service, a list of frames in tests),
feeds each frame's token ids through the output pipeline, and yields one ``ChatEventBatch`` per router
frame that produced events: ``Started`` first, ``Usage`` and ``Finish`` last.

**The turn ends at the finish frame**, not at the router's end of stream: the moment the finish frame's
events are known, and before its batch is yielded, ``on_finish`` runs (the service records the turn in the
prefix watch, shares it with other replicas, hands it to speculative prefill). A consumer that stops
reading right after the finish batch (a gateway that closes the stream on the finish frame) therefore
never loses the turn; a consumer that stops before it (the client cancelled) ends a turn that is never
recorded. After the finish frame the router stream is still read to its end (its client span ends there)
unless the consumer left.

Errors: an in-band router error or a transport failure ends the turn with :attr:`ChatTurn.error` set
(``sent`` says whether any batch went out: before one, the service ends the RPC with a status; after,
it sends the error in-band). A stream that ends without a finish frame is an ``InternalError``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

import grpc

from services.api import chat_pb2, worker_pb2
from services.common import errors, token_bytes
from services.common.errors import InternalError, MeshError
from services.parse import convert
from services.parse.continuation import Continued
from services.parse.parsers.events import Event
from services.parse.parsers.pipeline import OutputPipeline
from services.parse.prefix_watch import Turn
from services.parse.reasoning_tokens import ReasoningTokenCounter
from services.parse.speculative import TurnRecorder


class RouterStream(Protocol):
    """A turn's router frames (``ResumingRouterStream`` in the service); ``cancel`` leaves it early."""

    def cancel(self) -> None: ...

    def __aiter__(self) -> AsyncIterator[worker_pb2.GenerateResponse]: ...


class ChatTurn:
    """One turn's output stream (see the module docstring); one instance per Chat call."""

    def __init__(
        self,
        *,
        request_id: str,
        model: str,
        prompt_tokens: int,
        pipeline: OutputPipeline,
        watched: Turn | None = None,
        continued: Continued | None = None,
        observe: Callable[[list[Event]], None] = lambda events: None,
        spec_turn: TurnRecorder | None = None,
        on_finish: Callable[[ChatTurn], None] = lambda turn: None,
    ) -> None:
        self.request_id = request_id
        self._model = model
        self.prompt_tokens = prompt_tokens
        self.pipeline = pipeline
        self.watched = watched
        self._continued = continued
        self._observe = observe
        self.spec_turn = spec_turn
        self.output = TurnRecorder()  # the turn as a message (the prefix watch names a break's cause with it)
        self._on_finish = on_finish
        self.reasoning_tokens = ReasoningTokenCounter()
        self.worker_id = ""          # the worker that served the first frame (speculative prefill's target)
        self.finished = False        # the finish frame arrived (and ``on_finish`` ran)
        self.sent = False            # a batch went out
        self.error: MeshError | None = None
        self._announced = continued is not None  # a resumed stream's Started went out with its first part
        self._unsent_ids: list[int] = []  # ids of frames whose events are not sent yet, and their sizes
        self._unsent_frames: list[int] = []

    def replay(self, frames: Sequence[Sequence[int]]) -> None:
        """A resumed stream: feed the frames the first stream delivered, silently (same parser state, call ids)."""
        for frame_ids, replayed in zip(frames, self.pipeline.replay(frames), strict=True):
            if self.watched is not None:
                self.watched.extend(frame_ids)
            self.reasoning_tokens.feed(len(frame_ids), replayed)
            if self.spec_turn is not None:
                self.spec_turn.observe(replayed)
            if self.watched is not None:
                self.output.observe(replayed)

    async def stream(self, call: RouterStream) -> AsyncIterator[chat_pb2.ChatEventBatch]:
        """The turn's batches from ``call``'s frames; sets ``error`` instead of raising."""
        try:
            async for frame in call:  # read to the end: the client span ends at the stream's EOF
                if self.finished:
                    continue
                if frame.HasField("error"):
                    self.error = errors.from_proto(frame.error)
                    break
                batch = self._batch(frame)
                if batch.events:
                    self.sent = True
                    yield batch
        except grpc.aio.AioRpcError as exc:
            self.error = errors.from_rpc_error(exc)
        finally:
            call.cancel()  # no-op when the stream ended; cancels the router call when the consumer left
        if self.error is None and not self.finished:
            self.error = InternalError("the router stream ended without a finish frame")

    def _batch(self, frame: worker_pb2.GenerateResponse) -> chat_pb2.ChatEventBatch:
        """One router frame's events (the finish frame's with Usage and Finish, after ``on_finish`` ran)."""
        batch = chat_pb2.ChatEventBatch()
        if not self._announced:
            self._announced = True
            info = frame.prompt if frame.HasField("prompt") else worker_pb2.PromptInfo(
                prompt_tokens=self.prompt_tokens)
            batch.events.append(convert.started_event(self.request_id, self._model, info))
        if self.watched is not None:
            self.watched.extend(frame.token_ids)
        events = self.pipeline.feed(frame.token_ids)
        if frame.finish_reason:
            events += self.pipeline.finish()
        self._observe(events)
        self.reasoning_tokens.feed(len(frame.token_ids), events)
        if self.spec_turn is not None:
            self.spec_turn.observe(events)
        if self.watched is not None:
            self.output.observe(events)
        if not self.worker_id and frame.HasField("prompt"):
            self.worker_id = frame.prompt.worker_id
        batch.events.extend(convert.event_to_proto(e) for e in events)
        if frame.token_ids:
            self._unsent_ids.extend(frame.token_ids)
            self._unsent_frames.append(len(frame.token_ids))
        if frame.finish_reason:
            if self._continued is not None:
                self._continued.whole_usage(frame.usage)
            batch.events.extend(convert.finish_events(frame, tool_calls=self.pipeline.tool_calls,
                                                      reasoning_tokens=self.reasoning_tokens.total))
            self.finished = True
            self._on_finish(self)  # before the finish batch goes out: a consumer may stop reading at it
        if batch.events and self._unsent_ids:  # what a gateway sends back to resume this stream elsewhere
            batch.token_ids_u32 = token_bytes.pack(self._unsent_ids)
            if len(self._unsent_frames) > 1:
                batch.frame_sizes.extend(self._unsent_frames)
            self._unsent_ids, self._unsent_frames = [], []
        return batch
