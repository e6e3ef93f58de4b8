"""Parse-service event batches -> OpenAI ``chat.completion.chunk`` dicts, or one ``chat.completion``.

Pure and synchronous: no I/O, no parsing of model text. One instance per request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.api import chat_pb2, common_pb2
from services.common import errors

_FINISH: dict[int, str] = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_TOOL_CALLS: "tool_calls",
}

# Name of the SSE event that carries a tool call the moment its arguments are complete.
DISPATCH_EVENT = "tool_call_dispatch"

# Order of the fields inside one delta; a later event of an earlier kind starts a new chunk.
_RANK = {"reasoning_content": 0, "content": 1, "tool_calls": 2}


def finish_reason(reason: int, has_tool_calls: bool) -> str:
    """OpenAI's finish_reason; like OpenAI (and vLLM), a turn that made tool calls ends in "tool_calls"."""
    if reason == common_pb2.FINISH_REASON_LENGTH:
        return "length"
    if has_tool_calls:
        return "tool_calls"
    return _FINISH.get(reason, "stop")


def usage_dict(usage: common_pb2.Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


@dataclass
class _Call:
    id: str
    name: str
    arguments: str = ""


@dataclass
class _Turn:
    """What is known about the turn so far (shared by the stream encoder and the aggregator)."""

    usage: common_pb2.Usage = field(default_factory=common_pb2.Usage)
    has_usage: bool = False
    finish: int | None = None
    error: errors.MeshError | None = None
    calls: dict[int, _Call] = field(default_factory=dict)

    def note(self, ev: chat_pb2.ChatEvent) -> None:
        kind = ev.WhichOneof("event")
        if kind == "started" and not self.has_usage:
            self.usage.prompt_tokens = ev.started.prompt_tokens
            self.usage.cached_tokens = ev.started.cached_tokens
        elif kind == "usage":
            self.usage.CopyFrom(ev.usage)
            self.has_usage = True
        elif kind == "finish":
            self.finish = ev.finish.reason
        elif kind == "error":
            self.error = errors.from_proto(ev.error)

    def usage_dict(self) -> dict[str, Any]:
        return usage_dict(self.usage)

    def finish_reason(self) -> str:
        return finish_reason(self.finish or 0, bool(self.calls))


class ChunkEncoder:
    """Turns each ``ChatEventBatch`` into as few ``chat.completion.chunk`` dicts as practical.

    With ``dispatch_events``, each tool call dispatch also yields its own chunk (after the chunk that
    completes the call's arguments): ``"choices": []`` and the call under ``DISPATCH_EVENT`` as
    ``{"choice_index", "tool_call": {id, type, function: {name, arguments}}}`` — Dynamo's shape, sent as
    a named SSE event, yet a valid chunk so the official ``openai`` SDK iterates it like the usage chunk.
    """

    def __init__(
        self, completion_id: str, model: str, created: int, *, include_usage: bool, dispatch_events: bool = False
    ) -> None:
        self._base = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model}
        self._include_usage = include_usage
        self._dispatch_events = dispatch_events
        self._role_sent = False
        self._finish_sent = False
        self.turn = _Turn()

    @property
    def error(self) -> errors.MeshError | None:
        """Set once an in-band error event arrived; the caller ends the stream with it."""
        return self.turn.error

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            **self._base,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if self._include_usage:
            chunk["usage"] = None
        return chunk

    def feed(self, batch: chat_pb2.ChatEventBatch) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        delta: dict[str, Any] = {}

        def flush() -> None:
            nonlocal delta
            if delta:
                if not self._role_sent:
                    delta = {"role": "assistant", **delta}
                    self._role_sent = True
                out.append(self._chunk(delta))
                delta = {}

        def add(key: str, value: Any) -> None:
            if any(_RANK[k] > _RANK[key] for k in delta):
                flush()
            if key == "tool_calls":
                entries: list[dict[str, Any]] = delta.setdefault("tool_calls", [])
                last = entries[-1] if entries else None
                if last is not None and last["index"] == value["index"] and "id" not in value:
                    last["function"]["arguments"] += value["function"]["arguments"]
                else:
                    entries.append(value)
            else:
                delta[key] = delta.get(key, "") + value

        for ev in batch.events:
            if self.turn.error is not None:
                break
            self.turn.note(ev)
            kind = ev.WhichOneof("event")
            if self._finish_sent:
                continue  # only usage (noted above) may follow the finish
            if kind == "reasoning_delta" and ev.reasoning_delta.text:
                add("reasoning_content", ev.reasoning_delta.text)
            elif kind == "text_delta" and ev.text_delta.text:
                add("content", ev.text_delta.text)
            elif kind == "tool_call_start":
                self._start_call(ev.tool_call_start.index, ev.tool_call_start.id, ev.tool_call_start.name, add)
            elif kind == "tool_call_arguments_delta":
                d = ev.tool_call_arguments_delta
                self._append_args(d.index, d.delta, add)
            elif kind == "tool_call_dispatch":
                self._dispatch(ev.tool_call_dispatch, add)
                if self._dispatch_events:
                    flush()
                    out.append(self._dispatch_chunk(ev.tool_call_dispatch))
            elif kind == "finish":
                flush()
                out.extend(self._finish_chunks())
        flush()
        if not self._role_sent and self.turn.error is None:
            self._role_sent = True
            out.insert(0, self._chunk({"role": "assistant", "content": ""}))
        return out

    def _start_call(self, index: int, call_id: str, name: str, add: Any) -> None:
        call = _Call(id=call_id or f"call_{index}", name=name)
        self.turn.calls[index] = call
        add(
            "tool_calls",
            {"index": index, "id": call.id, "type": "function", "function": {"name": name, "arguments": ""}},
        )

    def _append_args(self, index: int, piece: str, add: Any) -> None:
        if not piece:
            return
        if index not in self.turn.calls:
            self._start_call(index, "", "", add)
        self.turn.calls[index].arguments += piece
        add("tool_calls", {"index": index, "function": {"arguments": piece}})

    def _dispatch(self, dispatch: chat_pb2.ToolCallDispatch, add: Any) -> None:
        # Streams normally announce and fill a call before dispatching it; a parser that only
        # reports complete calls still yields a well-formed OpenAI stream.
        index, call = dispatch.index, dispatch.call
        if index not in self.turn.calls:
            self._start_call(index, call.id, call.name, add)
        sent = self.turn.calls[index].arguments
        if call.arguments_json.startswith(sent):
            self._append_args(index, call.arguments_json[len(sent):], add)

    def _dispatch_chunk(self, dispatch: chat_pb2.ToolCallDispatch) -> dict[str, Any]:
        call = self.turn.calls[dispatch.index]
        tool_call = {"id": call.id, "type": "function",
                     "function": {"name": call.name, "arguments": dispatch.call.arguments_json}}
        return {**self._base, "choices": [], DISPATCH_EVENT: {"choice_index": 0, "tool_call": tool_call}}

    def _finish_chunks(self) -> list[dict[str, Any]]:
        if self._finish_sent:
            return []
        self._finish_sent = True
        return [self._chunk({}, self.turn.finish_reason())]

    def close(self) -> list[dict[str, Any]]:
        """The chunks that end a stream that ended without an error: finish (if not sent) and usage."""
        out = self._finish_chunks()
        if self._include_usage:
            out.append({**self._base, "choices": [], "usage": self.turn.usage_dict()})
        return out


class Aggregator:
    """Folds a whole stream into one non-streaming ``chat.completion`` response."""

    def __init__(self) -> None:
        self.turn = _Turn()
        self._reasoning: list[str] = []
        self._text: list[str] = []
        self._dispatched: dict[int, chat_pb2.ToolCall] = {}

    def feed(self, batch: chat_pb2.ChatEventBatch) -> None:
        for ev in batch.events:
            self.turn.note(ev)
            kind = ev.WhichOneof("event")
            if kind == "reasoning_delta":
                self._reasoning.append(ev.reasoning_delta.text)
            elif kind == "text_delta":
                self._text.append(ev.text_delta.text)
            elif kind == "tool_call_start":
                s = ev.tool_call_start
                self.turn.calls[s.index] = _Call(id=s.id or f"call_{s.index}", name=s.name)
            elif kind == "tool_call_arguments_delta":
                d = ev.tool_call_arguments_delta
                self.turn.calls.setdefault(d.index, _Call(id=d.id, name="")).arguments += d.delta
            elif kind == "tool_call_dispatch":
                call = ev.tool_call_dispatch.call
                index = ev.tool_call_dispatch.index
                self.turn.calls[index] = _Call(
                    id=call.id or f"call_{index}", name=call.name, arguments=call.arguments_json
                )

    def response(self, completion_id: str, model: str, created: int) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self._text) or None,
            "reasoning_content": "".join(self._reasoning) or None,
        }
        if self.turn.calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for _, c in sorted(self.turn.calls.items())
            ]
        return {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": self.turn.finish_reason()}
            ],
            "usage": self.turn.usage_dict(),
        }
