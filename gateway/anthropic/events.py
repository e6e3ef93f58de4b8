"""Parse event batches -> Anthropic stream events (pure), and the fold of those events into a message.

``MessageEncoder.feed(batch)`` returns the events for one batch, in the model's order:

- ``message_start`` on ``Started``: ``input_tokens`` is the uncached part of the prompt and
  ``cache_read_input_tokens`` the worker's prefix-cache hit (their sum is what count_tokens says).
- every reasoning segment is its own ``thinking`` block (``thinking_delta``s, then one
  ``signature_delta`` when it closes): think -> tool -> think -> tool is four blocks, and a closed
  block is never reopened.
- ``text`` blocks open only on text that is not whitespace: whitespace between blocks (the
  separators around tool calls, the blank line after ``</think>``) is held back and dropped unless
  more text follows in the same block, so no empty or whitespace-only text block is ever sent.
- ``tool_use`` blocks stream ``input_json_delta`` fragments and get ``content_block_stop`` on
  ``ToolCallDispatch`` — the moment the arguments are complete JSON, never earlier and never held.
- ``Finish`` closes what is open and sends ``message_delta`` (``stop_reason``, final usage) and
  ``message_stop``. An ``Error`` event sets ``error`` (the caller sends it in-band).

``MessageAssembler`` folds the same events into the non-streaming response, so both forms agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gateway.anthropic.signing import ThinkingSigner
from services.api import chat_pb2, common_pb2
from services.common import errors

Event = dict[str, Any]

_STOP_REASONS = {
    common_pb2.FINISH_REASON_STOP: "end_turn",
    common_pb2.FINISH_REASON_LENGTH: "max_tokens",
    common_pb2.FINISH_REASON_TOOL_CALLS: "tool_use",
    common_pb2.FINISH_REASON_CANCELLED: "end_turn",
    common_pb2.FINISH_REASON_ERROR: "end_turn",
}


@dataclass
class _Block:
    kind: str  # thinking | text | tool_use
    index: int
    text: str = ""  # thinking text (for the signature) or tool arguments streamed so far


@dataclass
class _Usage:
    prompt: int = 0
    cached: int = 0
    output: int = 0

    def fields(self) -> dict[str, int]:
        return {"input_tokens": max(self.prompt - self.cached, 0), "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": self.cached, "output_tokens": self.output}


@dataclass
class MessageEncoder:
    """Per-stream state machine from ``ChatEventBatch`` to Anthropic stream events."""

    message_id: str
    model: str
    signer: ThinkingSigner
    error: errors.MeshError | None = None
    finished: bool = False
    _open: _Block | None = None
    _next_index: int = 0
    _tools: dict[int, _Block] = field(default_factory=dict)
    _pending_ws: str = ""
    _segment_ended: bool = False  # text (even whitespace) came after the open thinking block
    _usage: _Usage = field(default_factory=_Usage)
    _started: bool = False

    def feed(self, batch: chat_pb2.ChatEventBatch) -> list[Event]:
        out: list[Event] = []
        for event in batch.events:
            kind = event.WhichOneof("event")
            if kind == "started":
                self._usage.prompt, self._usage.cached = event.started.prompt_tokens, event.started.cached_tokens
                out.append(self._message_start())
            elif kind == "reasoning_delta":
                self._reasoning(event.reasoning_delta.text, out)
            elif kind == "text_delta":
                self._text(event.text_delta.text, out)
            elif kind == "tool_call_start":
                self._tool_start(event.tool_call_start, out)
            elif kind == "tool_call_arguments_delta":
                self._tool_delta(event.tool_call_arguments_delta.index, event.tool_call_arguments_delta.delta, out)
            elif kind == "tool_call_dispatch":
                self._tool_dispatch(event.tool_call_dispatch, out)
            elif kind == "usage":
                u = event.usage
                self._usage = _Usage(u.prompt_tokens or self._usage.prompt, u.cached_tokens, u.completion_tokens)
            elif kind == "finish":
                self._finish(event.finish, out)
            elif kind == "error":
                self.error = errors.from_proto(event.error)
        return out

    def _message_start(self) -> Event:
        self._started = True
        return {"type": "message_start", "message": {
            "id": self.message_id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": self._usage.fields()}}

    def _close(self, out: list[Event]) -> None:
        block, self._open = self._open, None
        self._pending_ws = ""
        if block is None:
            return
        if block.kind == "thinking":
            out.append(_delta(block.index, {"type": "signature_delta", "signature": self.signer.sign(block.text)}))
        out.append({"type": "content_block_stop", "index": block.index})

    def _start(self, kind: str, content_block: dict[str, Any], out: list[Event]) -> _Block:
        self._close(out)
        block = _Block(kind, self._next_index)
        self._next_index += 1
        self._segment_ended = False
        out.append({"type": "content_block_start", "index": block.index, "content_block": content_block})
        self._open = block
        return block

    def _reasoning(self, text: str, out: list[Event]) -> None:
        if not text:
            return
        block = self._open
        if block is None or block.kind != "thinking" or self._segment_ended:
            block = self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""}, out)
        block.text += text
        out.append(_delta(block.index, {"type": "thinking_delta", "thinking": text}))

    def _text(self, text: str, out: list[Event]) -> None:
        block = self._open
        if block is not None and block.kind == "text":
            out.append(_delta(block.index, {"type": "text_delta", "text": text}))
            return
        if not (self._pending_ws + text).strip():
            self._pending_ws += text
            self._segment_ended = bool(text)
            return
        pending = self._pending_ws
        block = self._start("text", {"type": "text", "text": ""}, out)
        out.append(_delta(block.index, {"type": "text_delta", "text": (pending + text).lstrip("\n")}))

    def _tool_start(self, start: chat_pb2.ToolCallStart, out: list[Event]) -> None:
        block = self._start("tool_use", {"type": "tool_use", "id": start.id, "name": start.name, "input": {}}, out)
        self._tools[start.index] = block

    def _tool_delta(self, index: int, delta: str, out: list[Event]) -> None:
        block = self._tools.get(index)
        if block is None or not delta:
            return
        block.text += delta
        out.append(_delta(block.index, {"type": "input_json_delta", "partial_json": delta}))

    def _tool_dispatch(self, dispatch: chat_pb2.ToolCallDispatch, out: list[Event]) -> None:
        call = dispatch.call
        if dispatch.index not in self._tools:
            self._tool_start(chat_pb2.ToolCallStart(index=dispatch.index, id=call.id, name=call.name), out)
        block = self._tools[dispatch.index]
        if call.arguments_json.startswith(block.text):  # arguments the deltas did not carry yet
            self._tool_delta(dispatch.index, call.arguments_json[len(block.text):], out)
        if self._open is block:
            self._close(out)
        else:
            out.append({"type": "content_block_stop", "index": block.index})

    def _finish(self, finish: chat_pb2.Finish, out: list[Event]) -> None:
        if self._open is not None and self._open.kind == "tool_use":
            self._open = None  # arguments never completed: the block is not closed on partial JSON
        self._close(out)
        reason = _STOP_REASONS.get(finish.reason, "end_turn")
        if finish.stop_string:
            reason = "stop_sequence"
        out.append({"type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": finish.stop_string or None},
                    "usage": self._usage.fields()})
        out.append({"type": "message_stop"})
        self.finished = True


def _delta(index: int, delta: dict[str, Any]) -> Event:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def sse_events(events: list[Event]) -> bytes:
    """Several ``event:``/``data:`` frames in one write."""
    return b"".join(
        f"event: {e['type']}\ndata: ".encode() + json.dumps(e, separators=(",", ":"), ensure_ascii=False).encode()
        + b"\n\n"
        for e in events
    )


PING = b'event: ping\ndata: {"type":"ping"}\n\n'


class MessageAssembler:
    """Folds stream events into the non-streaming ``message`` response."""

    def __init__(self) -> None:
        self.message: dict[str, Any] = {}
        self._partial: dict[int, str] = {}

    def feed(self, events: list[Event]) -> None:
        for e in events:
            kind = e["type"]
            if kind == "message_start":
                self.message = dict(e["message"], content=[])
            elif kind == "content_block_start":
                self.message["content"].append(dict(e["content_block"]))
            elif kind == "content_block_delta":
                self._delta(e["index"], e["delta"])
            elif kind == "content_block_stop":
                self._stop(e["index"])
            elif kind == "message_delta":
                self.message.update(e["delta"])
                self.message["usage"] = e["usage"]

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self.message["content"][index]
        kind = delta["type"]
        if kind == "text_delta":
            block["text"] += delta["text"]
        elif kind == "thinking_delta":
            block["thinking"] += delta["thinking"]
        elif kind == "signature_delta":
            block["signature"] = delta["signature"]
        elif kind == "input_json_delta":
            self._partial[index] = self._partial.get(index, "") + delta["partial_json"]

    def _stop(self, index: int) -> None:
        block = self.message["content"][index]
        if block["type"] == "tool_use":
            raw = self._partial.pop(index, "")
            try:
                block["input"] = json.loads(raw) if raw.strip() else {}
            except json.JSONDecodeError:
                block["input"] = {}
