"""A turn's ``TurnFold`` deltas -> Responses API stream events, and the final ``response`` object.

Pure and synchronous; one instance per request, used for streaming and non-streaming alike.
Order per item: ``output_item.added`` -> deltas -> ``*.done`` -> ``output_item.done``. Reasoning
streams both as a summary (``reasoning_summary_*``) and raw (``reasoning_text.*``) whether or not a
summary was requested. A function call's item is done the moment the parse service dispatches it
(its arguments are complete), not at the end of the turn.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.apis.responses.errors import failed_error
from gateway.apis.responses.reasoning_codec import encode_reasoning
from gateway.turn import CallArguments, CallDispatched, CallStarted, Reasoning, Text, ToolCall, TurnFold
from services.api import chat_pb2, common_pb2
from services.common import errors

if TYPE_CHECKING:  # convert.py imports compaction.py, which imports this module
    from gateway.apis.responses.convert import ToolTable


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage_dict(usage: common_pb2.Usage) -> dict[str, Any]:
    """The Responses API's usage object."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


@dataclass
class _Item:
    """One output item while it streams."""

    kind: str                          # reasoning | message | function_call | custom_tool_call
    id: str
    index: int
    text: str = ""                     # reasoning text, message text, or call arguments
    call_id: str = ""
    name: str = ""
    done: dict[str, Any] | None = None  # the finished item


@dataclass
class ResponseEncoder:
    """Builds the stream events and the ``response`` object of one request.

    ``skeleton`` holds the request echo (model, tools, instructions, ...). Call ``start()`` once,
    ``feed()`` per batch, then ``close()`` (normal end) or ``fail()`` (error after the first byte);
    ``reply()`` is the final ``response`` object.
    """

    skeleton: dict[str, Any]
    tools: ToolTable
    include_encrypted: bool = True
    fold: TurnFold = field(default_factory=TurnFold)
    complete = False  # usage may follow the finish
    _seq: int = 0
    _items: list[_Item] = field(default_factory=list)
    _open: _Item | None = None                       # the open reasoning or message item
    _calls: dict[int, _Item] = field(default_factory=dict)

    def _ev(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def response(self, status: str) -> dict[str, Any]:
        """The ``response`` object with the items finished so far."""
        body = {**self.skeleton, "status": status,
                "output": [i.done for i in self._items if i.done is not None]}
        if status in ("completed", "incomplete", "failed"):
            body["usage"] = usage_dict(self.fold.usage)
        if status == "incomplete":
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        return body

    def start(self) -> list[dict[str, Any]]:
        snapshot = self.response("in_progress")
        return [self._ev("response.created", response=snapshot),
                self._ev("response.in_progress", response=snapshot)]

    @property
    def error(self) -> errors.MeshError | None:
        return self.fold.error

    def feed(self, batch: chat_pb2.ChatEventBatch) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for d in self.fold.feed(batch):
            if isinstance(d, Reasoning):
                self._delta("reasoning", d.text, out)
            elif isinstance(d, Text):
                self._delta("message", d.text, out)
            elif isinstance(d, CallStarted):
                self._start_call(d.call, out)
            elif isinstance(d, CallArguments):
                self._arguments(d.call, d.piece, out)
            elif isinstance(d, CallDispatched):
                item = self._calls[d.call.index]
                item.text = d.call.arguments
                self._finish_call(item, out)
        return out

    # -- reasoning and message items ---------------------------------------------------------

    def _new_item(self, kind: str, prefix: str, out: list[dict[str, Any]], **added: Any) -> _Item:
        item = _Item(kind=kind, id=new_id(prefix), index=len(self._items))
        self._items.append(item)
        out.append(self._ev("response.output_item.added", output_index=item.index,
                            item={"id": item.id, "type": kind, "status": "in_progress", **added}))
        return item

    def _delta(self, kind: str, text: str, out: list[dict[str, Any]]) -> None:
        item = self._open
        if item is None or item.kind != kind:
            self._close_open(out)
            item = self._open_item(kind, out)
        item.text += text
        ref = {"item_id": item.id, "output_index": item.index}
        if kind == "reasoning":
            out.append(self._ev("response.reasoning_summary_text.delta", **ref, summary_index=0, delta=text))
            out.append(self._ev("response.reasoning_text.delta", **ref, content_index=0, delta=text))
        else:
            out.append(self._ev("response.output_text.delta", **ref, content_index=0, delta=text, logprobs=[]))

    def _open_item(self, kind: str, out: list[dict[str, Any]]) -> _Item:
        if kind == "reasoning":
            item = self._new_item("reasoning", "rs", out, summary=[], content=[])
            ref = {"item_id": item.id, "output_index": item.index}
            out.append(self._ev("response.reasoning_summary_part.added", **ref, summary_index=0,
                                part={"type": "summary_text", "text": ""}))
            out.append(self._ev("response.content_part.added", **ref, content_index=0,
                                part={"type": "reasoning_text", "text": ""}))
        else:
            item = self._new_item("message", "msg", out, role="assistant", content=[])
            out.append(self._ev("response.content_part.added", item_id=item.id, output_index=item.index,
                                content_index=0, part=_output_text("")))
        self._open = item
        return item

    def _close_open(self, out: list[dict[str, Any]]) -> None:
        item, self._open = self._open, None
        if item is None:
            return
        ref = {"item_id": item.id, "output_index": item.index}
        if item.kind == "reasoning":
            summary = {"type": "summary_text", "text": item.text}
            content = {"type": "reasoning_text", "text": item.text}
            out.append(self._ev("response.reasoning_summary_text.done", **ref, summary_index=0, text=item.text))
            out.append(self._ev("response.reasoning_summary_part.done", **ref, summary_index=0, part=summary))
            out.append(self._ev("response.reasoning_text.done", **ref, content_index=0, text=item.text))
            out.append(self._ev("response.content_part.done", **ref, content_index=0, part=content))
            item.done = {"id": item.id, "type": "reasoning", "status": "completed", "summary": [summary],
                         "content": [content],
                         "encrypted_content": encode_reasoning(item.text) if self.include_encrypted else None}
        else:
            part = _output_text(item.text)
            out.append(self._ev("response.output_text.done", **ref, content_index=0, text=item.text, logprobs=[]))
            out.append(self._ev("response.content_part.done", **ref, content_index=0, part=part))
            item.done = {"id": item.id, "type": "message", "role": "assistant", "status": "completed",
                         "content": [part]}
        out.append(self._ev("response.output_item.done", output_index=item.index, item=item.done))

    # -- tool calls ------------------------------------------------------------------------------

    def _start_call(self, call: ToolCall, out: list[dict[str, Any]]) -> None:
        self._close_open(out)
        namespace = self.tools.namespace(call.name)
        extra = {"namespace": namespace} if namespace else {}
        if self.tools.kind(call.name) == "custom":
            item = self._new_item("custom_tool_call", "ctc", out, call_id=call.id, name=call.name, input="", **extra)
        else:
            item = self._new_item("function_call", "fc", out, call_id=call.id, name=call.name, arguments="", **extra)
        item.call_id, item.name = call.id, call.name
        self._calls[call.index] = item

    def _arguments(self, call: ToolCall, piece: str, out: list[dict[str, Any]]) -> None:
        item = self._calls[call.index]
        item.text = call.arguments
        if item.kind == "function_call":
            out.append(self._ev("response.function_call_arguments.delta", item_id=item.id,
                                output_index=item.index, delta=piece))

    def _finish_call(self, item: _Item, out: list[dict[str, Any]]) -> None:
        ref = {"item_id": item.id, "output_index": item.index}
        extra = {"namespace": ns} if (ns := self.tools.namespace(item.name)) else {}
        if item.kind == "custom_tool_call":
            raw = custom_input(item.text)
            out.append(self._ev("response.custom_tool_call_input.delta", **ref, delta=raw))
            out.append(self._ev("response.custom_tool_call_input.done", **ref, input=raw))
            item.done = {"id": item.id, "type": "custom_tool_call", "status": "completed",
                         "call_id": item.call_id, "name": item.name, "input": raw, **extra}
        else:
            out.append(self._ev("response.function_call_arguments.done", **ref, name=item.name,
                                arguments=item.text))
            item.done = {"id": item.id, "type": "function_call", "status": "completed",
                         "call_id": item.call_id, "name": item.name, "arguments": item.text, **extra}
        out.append(self._ev("response.output_item.done", output_index=item.index, item=item.done))

    # -- the end ---------------------------------------------------------------------------------

    def close(self) -> list[dict[str, Any]]:
        """Finish open items, then ``response.completed`` (or ``response.incomplete`` on length)."""
        out: list[dict[str, Any]] = []
        self._close_open(out)
        for _, item in sorted(self._calls.items()):
            if item.done is None:
                self._finish_call(item, out)
        out.append(self._ev(f"response.{self.status}", response=self.reply()))
        return out

    def fail(self, error: errors.MeshError) -> list[dict[str, Any]]:
        """``response.failed`` carrying ``error`` in OpenAI's shape."""
        failed = self.response("failed")
        failed["error"] = failed_error(error)
        return [self._ev("response.failed", response=failed)]

    @property
    def status(self) -> str:
        finish = self.fold.finish
        return "incomplete" if finish is not None and finish.reason == common_pb2.FINISH_REASON_LENGTH else "completed"

    def reply(self) -> dict[str, Any]:
        """The ``response`` object of a turn that ended without an error."""
        return self.response(self.status)

    def assistant_message(self) -> chat_pb2.Message:
        """The finished output as one canonical assistant message (stored for previous_response_id)."""
        msg = chat_pb2.Message(role="assistant")
        for item in self._items:
            if item.done is None:
                continue
            if item.kind == "reasoning":
                msg.parts.append(chat_pb2.Part(reasoning=item.text))
            elif item.kind == "message":
                msg.parts.append(chat_pb2.Part(text=item.text))
            else:
                args = item.text if item.kind == "function_call" else json.dumps({"input": custom_input(item.text)})
                msg.parts.append(chat_pb2.Part(tool_call=chat_pb2.ToolCall(
                    id=item.call_id, name=item.name, arguments_json=args or "{}")))
        return msg


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def custom_input(arguments_json: str) -> str:
    """A custom tool's raw input from the model's arguments (``{"input": ...}``, else the text as is)."""
    try:
        parsed = json.loads(arguments_json)
    except json.JSONDecodeError:
        return arguments_json
    if isinstance(parsed, dict) and isinstance(parsed.get("input"), str):
        return str(parsed["input"])
    return arguments_json
