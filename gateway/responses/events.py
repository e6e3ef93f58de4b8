"""Parse-service event batches -> Responses API stream events, and the final ``response`` object.

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
from typing import Any

from gateway.errors import error_body
from gateway.responses.convert import ToolTable
from gateway.responses.reasoning_codec import encode_reasoning
from services.api import chat_pb2, common_pb2
from services.common import errors


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
    ``feed()`` per batch, then ``close()`` (normal end) or ``fail()`` (error after the first byte).
    """

    skeleton: dict[str, Any]
    tools: ToolTable
    include_encrypted: bool = True
    error: errors.MeshError | None = None
    usage: common_pb2.Usage = field(default_factory=common_pb2.Usage)
    finish: int = 0
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
            body["usage"] = usage_dict(self.usage)
        if status == "incomplete":
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        return body

    def start(self) -> list[dict[str, Any]]:
        snapshot = self.response("in_progress")
        return [self._ev("response.created", response=snapshot),
                self._ev("response.in_progress", response=snapshot)]

    def feed(self, batch: chat_pb2.ChatEventBatch) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for ev in batch.events:
            if self.error is not None:
                break
            kind = ev.WhichOneof("event")
            if kind == "started":
                self.usage.prompt_tokens = ev.started.prompt_tokens
                self.usage.cached_tokens = ev.started.cached_tokens
            elif kind == "usage":
                self.usage.CopyFrom(ev.usage)
            elif kind == "finish":
                self.finish = ev.finish.reason
            elif kind == "error":
                self.error = errors.from_proto(ev.error)
            elif kind == "reasoning_delta" and ev.reasoning_delta.text:
                self._delta("reasoning", ev.reasoning_delta.text, out)
            elif kind == "text_delta" and ev.text_delta.text:
                self._delta("message", ev.text_delta.text, out)
            elif kind == "tool_call_start":
                start = ev.tool_call_start
                self._start_call(start.index, start.id, start.name, out)
            elif kind == "tool_call_arguments_delta":
                d = ev.tool_call_arguments_delta
                self._arguments(d.index, d.delta, out)
            elif kind == "tool_call_dispatch":
                self._dispatch(ev.tool_call_dispatch, out)
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

    def _start_call(self, index: int, call_id: str, name: str, out: list[dict[str, Any]]) -> _Item:
        self._close_open(out)
        call_id = call_id or new_id("call")
        namespace = self.tools.namespace(name)
        extra = {"namespace": namespace} if namespace else {}
        if self.tools.kind(name) == "custom":
            item = self._new_item("custom_tool_call", "ctc", out, call_id=call_id, name=name, input="", **extra)
        else:
            item = self._new_item("function_call", "fc", out, call_id=call_id, name=name, arguments="", **extra)
        item.call_id, item.name = call_id, name
        self._calls[index] = item
        return item

    def _arguments(self, index: int, piece: str, out: list[dict[str, Any]]) -> None:
        item = self._calls.get(index) or self._start_call(index, "", "", out)
        if not piece or item.done is not None:
            return
        item.text += piece
        if item.kind == "function_call":
            out.append(self._ev("response.function_call_arguments.delta", item_id=item.id,
                                output_index=item.index, delta=piece))

    def _dispatch(self, dispatch: chat_pb2.ToolCallDispatch, out: list[dict[str, Any]]) -> None:
        call = dispatch.call
        item = self._calls.get(dispatch.index) or self._start_call(dispatch.index, call.id, call.name, out)
        if item.done is not None:
            return
        if call.arguments_json.startswith(item.text):
            self._arguments(dispatch.index, call.arguments_json[len(item.text):], out)
        item.text = call.arguments_json or item.text
        self._finish_call(item, out)

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
        if self.finish == common_pb2.FINISH_REASON_LENGTH:
            out.append(self._ev("response.incomplete", response=self.response("incomplete")))
        else:
            out.append(self._ev("response.completed", response=self.response("completed")))
        return out

    def fail(self, error: BaseException) -> list[dict[str, Any]]:
        """``response.failed`` carrying ``error`` in OpenAI's shape (the gateway's one mapping)."""
        body = error_body(errors.as_mesh_error(error))["error"]
        failed = self.response("failed")
        failed["error"] = {"code": body["code"] or body["type"], "message": body["message"],
                           "type": body["type"], "param": body["param"]}
        return [self._ev("response.failed", response=failed)]

    @property
    def status(self) -> str:
        return "incomplete" if self.finish == common_pb2.FINISH_REASON_LENGTH else "completed"

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
