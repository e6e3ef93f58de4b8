"""A turn's ``TurnFold`` deltas -> OpenAI ``chat.completion.chunk`` dicts, or one ``chat.completion``.

Pure and synchronous: no I/O, no parsing of model text. One instance per request.
"""

from __future__ import annotations

from typing import Any

from gateway.apis.openai_chat.errors import error_body
from gateway.turn import CallArguments, CallDispatched, CallStarted, Finished, Reasoning, Text, TurnFold
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


def finish_reason(fold: TurnFold) -> str:
    """OpenAI's finish_reason; like OpenAI (and vLLM), a turn that made tool calls ends in "tool_calls"."""
    reason = fold.finish.reason if fold.finish is not None else 0
    if reason == common_pb2.FINISH_REASON_LENGTH:
        return "length"
    if fold.calls:
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


def sse_event(chunk: dict[str, Any]) -> str | None:
    """The SSE event name of a chunk: dispatch chunks are the named ``tool_call_dispatch`` event."""
    return DISPATCH_EVENT if DISPATCH_EVENT in chunk else None


class ChunkEncoder:
    """Turns each ``ChatEventBatch`` into as few ``chat.completion.chunk`` dicts as practical.

    With ``dispatch_events``, each tool call dispatch also yields its own chunk (after the chunk that
    completes the call's arguments): ``"choices": []`` and the call under ``DISPATCH_EVENT`` as
    ``{"choice_index", "tool_call": {id, type, function: {name, arguments}}}`` — Dynamo's shape, sent as
    a named SSE event, yet a valid chunk so the official ``openai`` SDK iterates it like the usage chunk.
    ``reply()`` is the non-streaming ``chat.completion`` of the same turn.
    """

    complete = False  # usage may follow the finish

    def __init__(
        self, completion_id: str, model: str, created: int, *, include_usage: bool, dispatch_events: bool = False
    ) -> None:
        self._base = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model}
        self._include_usage = include_usage
        self._dispatch_events = dispatch_events
        self._role_sent = False
        self._finish_sent = False
        self.fold = TurnFold()

    @property
    def error(self) -> errors.MeshError | None:
        """Set once an in-band error event arrived; the caller ends the stream with it."""
        return self.fold.error

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            **self._base,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if self._include_usage:
            chunk["usage"] = None
        return chunk

    def start(self) -> list[dict[str, Any]]:
        return []

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

        for d in self.fold.feed(batch):
            if isinstance(d, Reasoning):
                add("reasoning_content", d.text)
            elif isinstance(d, Text):
                add("content", d.text)
            elif isinstance(d, CallStarted):
                add("tool_calls", {"index": d.call.index, "id": d.call.id, "type": "function",
                                   "function": {"name": d.call.name, "arguments": ""}})
            elif isinstance(d, CallArguments):
                add("tool_calls", {"index": d.call.index, "function": {"arguments": d.piece}})
            elif isinstance(d, CallDispatched) and self._dispatch_events:
                flush()
                out.append(self._dispatch_chunk(d))
            elif isinstance(d, Finished):
                flush()
                out.extend(self._finish_chunks())
        flush()
        if not self._role_sent and self.fold.error is None:
            self._role_sent = True
            out.insert(0, self._chunk({"role": "assistant", "content": ""}))
        return out

    def _dispatch_chunk(self, dispatched: CallDispatched) -> dict[str, Any]:
        call = dispatched.call
        tool_call = {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
        return {**self._base, "choices": [], DISPATCH_EVENT: {"choice_index": 0, "tool_call": tool_call}}

    def _finish_chunks(self) -> list[dict[str, Any]]:
        if self._finish_sent:
            return []
        self._finish_sent = True
        return [self._chunk({}, finish_reason(self.fold))]

    def close(self) -> list[dict[str, Any]]:
        """The chunks that end a stream that ended without an error: finish (if not sent) and usage."""
        out = self._finish_chunks()
        if self._include_usage:
            out.append({**self._base, "choices": [], "usage": usage_dict(self.fold.usage)})
        return out

    def fail(self, error: errors.MeshError) -> list[dict[str, Any]]:
        """The in-band error of a stream that already started."""
        return [error_body(error)]

    def reply(self) -> dict[str, Any]:
        """The whole turn as one non-streaming ``chat.completion``."""
        fold = self.fold
        message: dict[str, Any] = {
            "role": "assistant",
            "content": fold.text or None,
            "reasoning_content": fold.reasoning or None,
        }
        if fold.calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for _, c in sorted(fold.calls.items())
            ]
        return {
            "id": self._base["id"],
            "object": "chat.completion",
            "created": self._base["created"],
            "model": self._base["model"],
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason(self.fold)}],
            "usage": usage_dict(fold.usage),
        }
