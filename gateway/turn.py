"""The one API-neutral fold of a turn: the parse service's ``ChatEventBatch`` frames -> turn state + deltas.

Every reader of a turn — the three HTTP APIs' encoders and the turn tracker — feeds its batches
through a :class:`TurnFold` and reads what it knows (usage, finish, tool calls, error) and the
:data:`Delta` list it returns per batch, so the rules below exist once:

- ``Started`` gives the prompt and cached tokens until a ``Usage`` event says otherwise; a ``Usage``
  field that is 0 (proto3: not reported) keeps the ``Started`` value.
- Tool calls are tracked by index. A call whose arguments arrive before its start, or that is
  dispatched before its arguments (or its start) streamed, is announced and filled first, so every
  reader sees start -> arguments -> dispatch. A call without an id gets ``call_<index>``. A second
  start or dispatch of the same call, and arguments after its dispatch, say nothing new.
- Empty text, reasoning and argument pieces carry nothing and are dropped.
- After ``Finish`` only ``Usage`` and ``Error`` still count; output events are ignored.
- The first ``Error`` ends the turn: it and everything after it (this batch and later ones) are not folded.

Pure and synchronous: no I/O, no API shapes. One instance per reader of one stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.api import chat_pb2, common_pb2
from services.common import errors

# API-neutral names of the finish reasons (trace records, span attributes).
FINISH_NAMES: dict[int, str] = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_TOOL_CALLS: "tool_calls",
    common_pb2.FINISH_REASON_CANCELLED: "cancelled",
    common_pb2.FINISH_REASON_ERROR: "error",
}


@dataclass
class ToolCall:
    """One tool call of the turn as far as it streamed."""

    index: int
    id: str
    name: str
    arguments: str = ""      # streamed so far; once dispatched, the dispatched ``arguments_json``
    dispatched: bool = False


# -- deltas: what one batch changed, in the model's order ------------------------------------------


@dataclass(frozen=True)
class Started:
    """The request reached a worker (``TurnFold.usage`` has the prompt and cached tokens)."""


@dataclass(frozen=True)
class Reasoning:
    text: str


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class CallStarted:
    call: ToolCall


@dataclass(frozen=True)
class CallArguments:
    call: ToolCall
    piece: str


@dataclass(frozen=True)
class CallDispatched:
    """The call's arguments are complete (``call.arguments``): the harness may run it now."""

    call: ToolCall


@dataclass(frozen=True)
class Finished:
    finish: chat_pb2.Finish


@dataclass(frozen=True)
class Failed:
    error: errors.MeshError


Delta = Started | Reasoning | Text | CallStarted | CallArguments | CallDispatched | Finished | Failed
OUTPUT = (Reasoning, Text, CallStarted, CallArguments, CallDispatched)  # what the model produced


@dataclass
class TurnFold:
    """What is known about one turn; ``feed`` folds a batch and returns its deltas."""

    worker_id: str = ""
    finish: chat_pb2.Finish | None = None
    error: errors.MeshError | None = None
    calls: dict[int, ToolCall] = field(default_factory=dict)
    _started: common_pb2.Usage = field(default_factory=common_pb2.Usage)
    _usage: common_pb2.Usage | None = None
    _text: list[str] = field(default_factory=list)
    _reasoning: list[str] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.finish is not None

    @property
    def finish_name(self) -> str:
        """The API-neutral finish reason (``stop``, ``length``, ...), "" before the finish."""
        return "" if self.finish is None else FINISH_NAMES.get(self.finish.reason, "")

    @property
    def usage(self) -> common_pb2.Usage:
        """The turn's usage so far: the ``Usage`` event's, else what ``Started`` said."""
        out = common_pb2.Usage()
        out.CopyFrom(self._usage if self._usage is not None else self._started)
        out.prompt_tokens = out.prompt_tokens or self._started.prompt_tokens
        out.cached_tokens = out.cached_tokens or self._started.cached_tokens
        return out

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)

    def feed(self, batch: chat_pb2.ChatEventBatch) -> list[Delta]:
        out: list[Delta] = []
        for ev in batch.events:
            if self.error is not None:
                break
            kind = ev.WhichOneof("event")
            if kind == "error":
                self.error = errors.from_proto(ev.error)
                out.append(Failed(self.error))
            elif kind == "usage":
                self._usage = common_pb2.Usage()
                self._usage.CopyFrom(ev.usage)
            elif kind == "started":
                self.worker_id = ev.started.worker_id
                self._started.prompt_tokens = ev.started.prompt_tokens
                self._started.cached_tokens = ev.started.cached_tokens
                out.append(Started())
            elif self.finish is not None:
                continue  # output after the finish is not part of the turn
            elif kind == "finish":
                self.finish = ev.finish
                out.append(Finished(ev.finish))
            elif kind == "reasoning_delta" and ev.reasoning_delta.text:
                self._reasoning.append(ev.reasoning_delta.text)
                out.append(Reasoning(ev.reasoning_delta.text))
            elif kind == "text_delta" and ev.text_delta.text:
                self._text.append(ev.text_delta.text)
                out.append(Text(ev.text_delta.text))
            elif kind == "tool_call_start":
                s = ev.tool_call_start
                if s.index not in self.calls:
                    self._start(s.index, s.id, s.name, out)
            elif kind == "tool_call_arguments_delta":
                d = ev.tool_call_arguments_delta
                call = self.calls.get(d.index) or self._start(d.index, d.id, "", out)
                self._arguments(call, d.delta, out)
            elif kind == "tool_call_dispatch":
                self._dispatch(ev.tool_call_dispatch, out)
        return out

    def _start(self, index: int, call_id: str, name: str, out: list[Delta]) -> ToolCall:
        call = ToolCall(index=index, id=call_id or f"call_{index}", name=name)
        self.calls[index] = call
        out.append(CallStarted(call))
        return call

    def _arguments(self, call: ToolCall, piece: str, out: list[Delta]) -> None:
        if not piece or call.dispatched:
            return
        call.arguments += piece
        out.append(CallArguments(call, piece))

    def _dispatch(self, dispatch: chat_pb2.ToolCallDispatch, out: list[Delta]) -> None:
        # Streams normally announce and fill a call before dispatching it; a parser that only reports
        # complete calls still gives every reader a start and the arguments first.
        sent = dispatch.call
        call = self.calls.get(dispatch.index) or self._start(dispatch.index, sent.id, sent.name, out)
        if call.dispatched:
            return
        if sent.arguments_json.startswith(call.arguments):
            self._arguments(call, sent.arguments_json[len(call.arguments):], out)
        call.arguments = sent.arguments_json or call.arguments
        call.name = call.name or sent.name
        call.dispatched = True
        out.append(CallDispatched(call))
