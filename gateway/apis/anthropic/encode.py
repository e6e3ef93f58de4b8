"""A turn's ``TurnFold`` deltas -> Anthropic stream events, and the non-streaming message (pure).

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
  ``message_stop``; nothing after it is read. An ``Error`` event sets ``error`` and ends the turn
  (the caller sends it in-band); a stream that ends without a ``Finish`` is an internal error.

``reply()`` is the non-streaming message, built from the same blocks the stream showed, so both
forms agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gateway.apis.anthropic.errors import error_body
from gateway.apis.anthropic.signing import ThinkingSigner
from gateway.streaming import typed_events
from gateway.turn import (
    CallArguments,
    CallDispatched,
    CallStarted,
    Finished,
    Reasoning,
    Started,
    Text,
    ToolCall,
    TurnFold,
)
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

PING = typed_events([{"type": "ping"}])


def tool_use_id(call_id: str) -> str:
    """Anthropic's form of a tool call id: ``toolu_...`` (clients and dashboards key on the prefix); the
    mesh's ``call_...`` ids are renamed, an id of another form is kept. The client sends it back as it got it."""
    return "toolu_" + call_id.removeprefix("call_") if call_id.startswith("call_") else call_id


def mesh_call_id(tool_use: str) -> str:
    """The inverse of ``tool_use_id``, for ids the client sends back (``tool_use.id``, ``tool_use_id``):
    ``toolu_X`` is the mesh's ``call_X`` again, so the conversation holds the ids the other APIs would
    (same prompt, same cache) and a tool result finds the call we dispatched (``harness.tool`` span)."""
    return "call_" + tool_use.removeprefix("toolu_") if tool_use.startswith("toolu_") else tool_use


@dataclass
class _Block:
    kind: str  # thinking | text | tool_use
    index: int
    content: dict[str, Any]  # the block as the non-streaming message shows it
    text: str = ""  # thinking text (for the signature) or tool arguments streamed so far
    stopped: bool = False  # content_block_stop went out (a block is stopped once)


def usage_fields(usage: common_pb2.Usage) -> dict[str, int]:
    """Anthropic's usage: ``input_tokens`` is the uncached part of the prompt."""
    return {"input_tokens": max(usage.prompt_tokens - usage.cached_tokens, 0), "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": usage.cached_tokens, "output_tokens": usage.completion_tokens}


@dataclass
class MessageEncoder:
    """Per-stream state machine from a turn's deltas to Anthropic stream events."""

    message_id: str
    model: str
    signer: ThinkingSigner
    fold: TurnFold = field(default_factory=TurnFold)
    _open: _Block | None = None
    _blocks: list[_Block] = field(default_factory=list)
    _tools: dict[int, _Block] = field(default_factory=dict)
    _pending_ws: str = ""
    _segment_ended: bool = False  # text (even whitespace) came after the open thinking block
    _stop: dict[str, Any] = field(default_factory=lambda: {"stop_reason": None, "stop_sequence": None})

    @property
    def error(self) -> errors.MeshError | None:
        return self.fold.error

    @property
    def finished(self) -> bool:
        return self.fold.finished

    @property
    def complete(self) -> bool:
        return self.fold.finished  # message_stop went out: nothing later can be shown

    def start(self) -> list[Event]:
        return []

    def feed(self, batch: chat_pb2.ChatEventBatch) -> list[Event]:
        out: list[Event] = []
        for d in self.fold.feed(batch):
            if isinstance(d, Started):
                out.append(self._message_start())
            elif isinstance(d, Reasoning):
                self._reasoning(d.text, out)
            elif isinstance(d, Text):
                self._text(d.text, out)
            elif isinstance(d, CallStarted):
                self._tool_start(d.call, out)
            elif isinstance(d, CallArguments):
                self._tool_delta(d.call, d.piece, out)
            elif isinstance(d, CallDispatched):
                self._tool_dispatch(d.call, out)
            elif isinstance(d, Finished):
                self._finish(d.finish, out)
        return out

    def _message(self, content: list[dict[str, Any]]) -> Event:
        return {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, **self._stop, "usage": usage_fields(self.fold.usage)}

    def _message_start(self) -> Event:
        return {"type": "message_start", "message": self._message([])}

    def _delta(self, block: _Block, delta: dict[str, Any], out: list[Event]) -> None:
        out.append({"type": "content_block_delta", "index": block.index, "delta": delta})
        kind = delta["type"]
        if kind == "text_delta":
            block.content["text"] += delta["text"]
        elif kind == "thinking_delta":
            block.content["thinking"] += delta["thinking"]
        elif kind == "signature_delta":
            block.content["signature"] = delta["signature"]

    def _stop_block(self, block: _Block, out: list[Event]) -> None:
        if block.stopped:
            return  # a tool block closed when the next block began is not stopped again at its dispatch
        block.stopped = True
        if block.kind == "thinking":
            self._delta(block, {"type": "signature_delta", "signature": self.signer.sign(block.text)}, out)
        elif block.kind == "tool_use":
            try:
                block.content["input"] = json.loads(block.text) if block.text.strip() else {}
            except json.JSONDecodeError:
                block.content["input"] = {}
        out.append({"type": "content_block_stop", "index": block.index})

    def _close(self, out: list[Event]) -> None:
        block, self._open = self._open, None
        self._pending_ws = ""
        if block is not None:
            self._stop_block(block, out)

    def _start(self, kind: str, content_block: dict[str, Any], out: list[Event]) -> _Block:
        self._close(out)
        block = _Block(kind, len(self._blocks), dict(content_block))
        self._blocks.append(block)
        self._segment_ended = False
        out.append({"type": "content_block_start", "index": block.index, "content_block": content_block})
        self._open = block
        return block

    def _reasoning(self, text: str, out: list[Event]) -> None:
        block = self._open
        if block is None or block.kind != "thinking" or self._segment_ended:
            block = self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""}, out)
        block.text += text
        self._delta(block, {"type": "thinking_delta", "thinking": text}, out)

    def _text(self, text: str, out: list[Event]) -> None:
        block = self._open
        if block is not None and block.kind == "text":
            self._delta(block, {"type": "text_delta", "text": text}, out)
            return
        if not (self._pending_ws + text).strip():
            self._pending_ws += text
            self._segment_ended = True
            return
        pending = self._pending_ws
        block = self._start("text", {"type": "text", "text": ""}, out)
        self._delta(block, {"type": "text_delta", "text": (pending + text).lstrip("\n")}, out)

    def _tool_start(self, call: ToolCall, out: list[Event]) -> None:
        block = self._start("tool_use", {"type": "tool_use", "id": tool_use_id(call.id), "name": call.name,
                                         "input": {}}, out)
        self._tools[call.index] = block

    def _tool_delta(self, call: ToolCall, piece: str, out: list[Event]) -> None:
        block = self._tools[call.index]
        block.text += piece
        self._delta(block, {"type": "input_json_delta", "partial_json": piece}, out)

    def _tool_dispatch(self, call: ToolCall, out: list[Event]) -> None:
        block = self._tools[call.index]
        if self._open is block:
            self._close(out)
        else:
            self._stop_block(block, out)

    def _finish(self, finish: chat_pb2.Finish, out: list[Event]) -> None:
        if self._open is not None and self._open.kind == "tool_use":
            self._open = None  # arguments never completed: the block is not closed on partial JSON
        self._close(out)
        reason = _STOP_REASONS.get(finish.reason, "end_turn")
        if finish.stop_string:
            reason = "stop_sequence"
        self._stop = {"stop_reason": reason, "stop_sequence": finish.stop_string or None}
        out.append({"type": "message_delta", "delta": dict(self._stop), "usage": usage_fields(self.fold.usage)})
        out.append({"type": "message_stop"})

    def close(self) -> list[Event]:
        """Nothing more to send (``message_stop`` went out with the finish); without one the turn is broken."""
        if not self.fold.finished:
            raise errors.InternalError("the parse stream ended without a finish event")
        return []

    def fail(self, error: errors.MeshError) -> list[Event]:
        """The in-band ``event: error`` of a stream that already started."""
        return [error_body(error, self.message_id)]

    def reply(self) -> Event:
        """The non-streaming message: the blocks the stream showed, the stop reason and the final usage."""
        return self._message([b.content for b in self._blocks])
