"""A Responses API request (+ stored history + headers) -> the canonical ``ChatRequest``.

Items map onto the canonical conversation with ordered parts: consecutive assistant-side items
(``reasoning``, ``function_call``, ``custom_tool_call``, assistant ``message``) become one
assistant message whose parts keep their order, with content "" when it has no text
(docs/conversation-mapping.md); ``*_output`` items become ``tool`` messages; a ``compaction`` item becomes
the user message holding the summary it seals (``compaction.py``), and a final ``compaction_trigger`` makes
the request a compaction. An item type not in ``_ITEM_MODELS`` (or ``additional_tools``) is a 400 naming
``input[i].type``, never dropped. Tools the model cannot run (``web_search``, ``tool_search``, ...) are left
out with a debug log. Custom (freeform) tools reach the model as a function with one
string argument ``input``; ``ToolTable`` maps the model's calls back to the right item type.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import structlog
from pydantic import BaseModel, ValidationError

from gateway.apis.canonical import (
    identity_and_hints,
    mode_tool_choice,
    named_tool_choice,
    sampling_params,
    with_content,
)
from gateway.apis.responses import compaction
from gateway.apis.responses.errors import from_validation_error
from gateway.apis.responses.models import (
    CompactionItem,
    ContentPartIn,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    CustomToolDef,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionToolDef,
    MessageItem,
    NamespaceToolDef,
    ReasoningItem,
    ResponsesRequest,
)
from gateway.apis.responses.reasoning_codec import decode_reasoning
from gateway.converted_messages import ConvertedMessages
from gateway.signing import Sealer
from services.api import chat_pb2
from services.common.errors import InvalidRequestError

log = structlog.get_logger()

_ITEM_MODELS: dict[str, type[BaseModel]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "custom_tool_call": CustomToolCallItem,
    "custom_tool_call_output": CustomToolCallOutputItem,
    "reasoning": ReasoningItem,
    "compaction": CompactionItem,
}
_KNOWN_TYPES = ", ".join(sorted([*_ITEM_MODELS, "additional_tools", compaction.TRIGGER]))
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})
_CUSTOM_INPUT_SCHEMA = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The raw input of this freeform tool."}},
    "required": ["input"],
}


@dataclass(frozen=True)
class ToolSpec:
    """How a tool the model may call maps back to an output item."""

    kind: str                      # "function" | "custom"
    namespace: str | None = None


@dataclass
class ToolTable:
    """The tools offered to the model, by the name the model calls them."""

    specs: dict[str, ToolSpec] = field(default_factory=dict)

    def kind(self, name: str) -> str:
        spec = self.specs.get(name)
        return spec.kind if spec else "function"

    def namespace(self, name: str) -> str | None:
        spec = self.specs.get(name)
        return spec.namespace if spec else None


@dataclass
class Converted:
    """The canonical request plus what the response needs to know about the conversation."""

    chat: chat_pb2.ChatRequest
    tools: ToolTable
    history: list[chat_pb2.Message]   # the conversation without instructions (stored for previous_response_id)


def _validate(model: type[BaseModel], raw: Any, param: str) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        err = from_validation_error(exc)
        detail = err.message.removeprefix(f"{err.param}: ") if err.param else err.message
        prefixed = f"{param}.{err.param}" if err.param else param
        raise InvalidRequestError(f"{prefixed}: {detail}", param=prefixed) from exc


def _text(content: str | list[ContentPartIn], param: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type not in _TEXT_PARTS:
            raise InvalidRequestError(
                f"content part type {part.type!r} is not supported by this model (only text)",
                param=f"{param}[{j}].type",
            )
        texts.append(part.text or "")
    return "".join(texts)


def _reasoning_text(item: ReasoningItem) -> str:
    """The reasoning to replay: raw content, else our own encrypted_content, else the summary."""
    if item.content:
        return "".join(c.text for c in item.content)
    decoded = decode_reasoning(item.encrypted_content)
    if decoded is not None:
        return decoded
    return "\n\n".join(s.text for s in item.summary if s.text)


def _item_kind(entry: dict[str, Any], param: str) -> str | None:
    """An input item's type (``message`` when it has a role and no type; None when it has neither); a type that
    is not a string is an invalid request naming ``param``."""
    kind = entry.get("type", "message" if "role" in entry else None)
    if kind is not None and not isinstance(kind, str):
        raise InvalidRequestError(f"{param}.type must be a string, not {type(kind).__name__}", param=f"{param}.type")
    return kind


class _Builder:
    """Appends items to the canonical message list, merging assistant-side items into one turn."""

    def __init__(self, messages: list[chat_pb2.Message], call_names: dict[str, str] | None = None,
                 sealer: Sealer | None = None) -> None:
        self.messages = messages
        self.sealer = sealer
        self.call_names: dict[str, str] = {
            part.tool_call.id: part.tool_call.name
            for m in messages for part in m.parts if part.WhichOneof("kind") == "tool_call"
        } if call_names is None else call_names
        self.calls: list[tuple[str, str]] = []  # (call_id, name) of the calls added

    def _assistant(self) -> chat_pb2.Message:
        if not self.messages or self.messages[-1].role != "assistant":
            self.messages.append(chat_pb2.Message(role="assistant"))
        return self.messages[-1]

    def message(self, item: MessageItem, param: str) -> None:
        text = _text(item.content, f"{param}.content")
        if item.role == "assistant":
            self._assistant().parts.append(chat_pb2.Part(text=text))
            return
        self.messages.append(chat_pb2.Message(role=item.role, parts=[chat_pb2.Part(text=text)]))

    def reasoning(self, item: ReasoningItem) -> None:
        text = _reasoning_text(item)
        if text:
            self._assistant().parts.append(chat_pb2.Part(reasoning=text))

    def call(self, call_id: str, name: str, arguments_json: str) -> None:
        self.call_names[call_id] = name
        self.calls.append((call_id, name))
        call = chat_pb2.ToolCall(id=call_id, name=name, arguments_json=arguments_json)
        self._assistant().parts.append(chat_pb2.Part(tool_call=call))

    def output(self, call_id: str, output: str | list[ContentPartIn], param: str) -> None:
        self.messages.append(chat_pb2.Message(
            role="tool", tool_call_id=call_id, name=self.call_names.get(call_id, ""),
            parts=[chat_pb2.Part(text=_text(output, f"{param}.output"))],
        ))

    def add(self, entry: Any, i: int, tools: ToolTable, tools_out: list[chat_pb2.Tool]) -> None:
        """Item ``i`` of the request's ``input``."""
        param = f"input[{i}]"
        if not isinstance(entry, dict):
            raise InvalidRequestError(f"{param} must be an object", param=param)
        kind = _item_kind(entry, param)
        if kind == "additional_tools":
            add_tools(entry.get("tools") or [], tools, tools_out, f"{param}.tools")
            return
        if kind == compaction.TRIGGER:
            raise InvalidRequestError(f"{param}: a compaction_trigger item must be the last input item",
                                      param=f"{param}.type")
        model = _ITEM_MODELS.get(kind) if kind is not None else None
        if model is None:
            said = f"type {kind!r} is not supported" if kind is not None else "has no type (nor a role)"
            raise InvalidRequestError(f"{param}: input item {said}; this server knows {_KNOWN_TYPES}",
                                      param=f"{param}.type")
        item = _validate(model, {**entry, "type": kind}, param)
        if isinstance(item, CompactionItem):
            summary = compaction.opened_summary(self.sealer, item.encrypted_content, param)
            self.messages.append(compaction.summary_message(summary))
        elif isinstance(item, MessageItem):
            self.message(item, param)
        elif isinstance(item, ReasoningItem):
            self.reasoning(item)
        elif isinstance(item, FunctionCallItem):
            self.call(item.call_id, item.name, item.arguments or "{}")
        elif isinstance(item, CustomToolCallItem):
            self.call(item.call_id, item.name, json.dumps({"input": item.input}))
        elif isinstance(item, FunctionCallOutputItem | CustomToolCallOutputItem):
            self.output(item.call_id, item.output, param)


class ConvertedRun(NamedTuple):
    """A run of input items converted: its canonical messages and the tool calls ``(call_id, name)`` it makes,
    which name the outputs after it."""

    messages: tuple[chat_pb2.Message, ...]
    calls: tuple[tuple[str, str], ...]


def converted_runs() -> ConvertedMessages[ConvertedRun]:
    """A memo of recent conversations' converted item runs for :func:`chat_request`."""
    return ConvertedMessages(lambda run: sum(m.ByteSize() for m in run.messages))


_STARTS_RUN = frozenset({"function_call_output", "custom_tool_call_output", "compaction"})


def _runs(raw: list[Any]) -> list[tuple[Any, ...]] | None:
    """``raw`` cut before every item that always starts a message of its own (a user, system or developer
    message, a tool output): each run then converts alone, given the calls before it. None where that does
    not hold (an item that is not an object, or an ``additional_tools`` item, which adds tools)."""
    runs: list[tuple[Any, ...]] = []
    start = 0
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            return None
        kind = _item_kind(entry, f"input[{i}]")
        if kind == "additional_tools":
            return None
        if i > start and (kind in _STARTS_RUN or (kind == "message" and entry.get("role") != "assistant")):
            runs.append(tuple(raw[start:i]))
            start = i
    if start < len(raw):
        runs.append(tuple(raw[start:]))
    return runs


def _convert_runs(raw: list[Any], runs: list[tuple[Any, ...]], tools: ToolTable, tools_out: list[chat_pb2.Tool],
                  converted: ConvertedMessages[ConvertedRun], sealer: Sealer | None) -> list[chat_pb2.Message]:
    starts = [0, *itertools.accumulate(map(len, runs))]  # run k is raw[starts[k]:starts[k + 1]]
    call_names: dict[str, str] = {}

    def resume(reused: Sequence[ConvertedRun]) -> None:
        for run in reused:
            call_names.update(run.calls)

    def convert_one(k: int) -> ConvertedRun:
        builder = _Builder([], call_names, sealer)
        for i in range(starts[k], starts[k + 1]):
            builder.add(raw[i], i, tools, tools_out)
        return ConvertedRun(tuple(with_content(m) for m in builder.messages), tuple(builder.calls))

    return [m for run in converted.convert(runs, convert_one, resume) for m in run.messages]


def convert_input(
    raw: str | list[dict[str, Any]], history: Sequence[chat_pb2.Message], tools: ToolTable,
    tools_out: list[chat_pb2.Tool], converted: ConvertedMessages[ConvertedRun] | None = None,
    sealer: Sealer | None = None,
) -> list[chat_pb2.Message]:
    """``history`` followed by the request's ``input`` as canonical messages (without instructions).

    Tools carried by ``additional_tools`` items (Codex's responses-lite models) join ``tools_out``. With
    ``converted`` and no history, runs of items equal to a recent request's are not converted again
    (``gateway.converted_messages``). ``sealer`` opens ``compaction`` items (without one, every such item
    is a 400).
    """
    if isinstance(raw, str):
        messages = [chat_pb2.Message.FromString(m.SerializeToString()) for m in history]
        messages.append(chat_pb2.Message(role="user", parts=[chat_pb2.Part(text=raw)]))
        return messages
    if converted is not None and not history:
        runs = _runs(raw)
        if runs is not None:
            return _convert_runs(raw, runs, tools, tools_out, converted, sealer)
    builder = _Builder([chat_pb2.Message.FromString(m.SerializeToString()) for m in history], sealer=sealer)
    for i, entry in enumerate(raw):
        builder.add(entry, i, tools, tools_out)
    return builder.messages


def _custom_description(tool: CustomToolDef) -> str:
    text = tool.description or ""
    fmt = tool.format
    if fmt is not None and fmt.type == "grammar" and fmt.definition:
        text += f"\n\nThe input must match this {fmt.syntax or ''} grammar:\n{fmt.definition}"
    return text + "\n\nFreeform tool: put the raw input text in the `input` argument."


def add_tools(
    raw: Sequence[Any], table: ToolTable, out: list[chat_pb2.Tool], param: str, namespace: str | None = None
) -> None:
    """Append the model-runnable tools of ``raw`` to ``out`` and ``table``; drop built-in tools."""
    for i, entry in enumerate(raw):
        where = f"{param}[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
            raise InvalidRequestError(f"{where} must be an object with a type", param=f"{where}.type")
        kind = entry["type"]
        if kind == "function":
            fn = _validate(FunctionToolDef, entry, where)
            params = fn.parameters or {"type": "object", "properties": {}}
            out.append(chat_pb2.Tool(name=fn.name, description=fn.description or "",
                                     parameters_json=json.dumps(params)))
            table.specs[fn.name] = ToolSpec("function", namespace)
        elif kind == "custom":
            custom = _validate(CustomToolDef, entry, where)
            out.append(chat_pb2.Tool(name=custom.name, description=_custom_description(custom),
                                     parameters_json=json.dumps(_CUSTOM_INPUT_SCHEMA)))
            table.specs[custom.name] = ToolSpec("custom", namespace)
        elif kind == "namespace":
            group = _validate(NamespaceToolDef, entry, where)
            add_tools(group.tools, table, out, f"{where}.tools", namespace=group.name)
        else:
            log.debug("responses.tool_skipped", tool_type=kind, param=where)


def _tool_choice(body: ResponsesRequest, tools: Sequence[chat_pb2.Tool]) -> chat_pb2.ToolChoice:
    choice = body.tool_choice
    if choice is None:
        return chat_pb2.ToolChoice(mode="auto")
    if isinstance(choice, str):
        return mode_tool_choice(choice, tools)
    if choice.type in ("function", "custom"):
        return named_tool_choice(choice.name, tools, param="tool_choice.name")
    return chat_pb2.ToolChoice(mode="auto")  # allowed_tools, built-in tool types: the model decides


def template_kwargs(body: ResponsesRequest) -> dict[str, Any]:
    """Chat-template variables from ``reasoning.effort`` (``none`` turns thinking off)."""
    effort = body.reasoning.effort if body.reasoning else None
    if effort is None:
        return {}
    if effort == "none":
        return {"enable_thinking": False}
    return {"reasoning_effort": effort}


def chat_request(
    body: ResponsesRequest,
    headers: Mapping[str, str],
    history: Sequence[chat_pb2.Message],
    *,
    model: str,
    request_id: str,
    converted: ConvertedMessages[ConvertedRun] | None = None,
    sealer: Sealer | None = None,
    compaction_instruction: str = "",
    tools_json: Sequence[Any] | None = None,
) -> Converted:
    """The canonical request for a Responses API request continuing ``history`` (``converted``, ``sealer``:
    see :func:`convert_input`). An input ending with ``compaction_trigger`` (or any input, for the v1 compact
    endpoint, which passes ``compaction_instruction`` itself) is a compaction: the conversation before it,
    then ``compaction_instruction``. ``tools_json`` replaces the body's ``tools`` (a Codex local compaction's
    tools: ``local_compaction.py``)."""
    table = ToolTable()
    tools: list[chat_pb2.Tool] = []
    add_tools(body.tools or [] if tools_json is None else tools_json, table, tools, "tools")
    raw = body.input
    if compaction.ends_with_trigger(raw):
        assert isinstance(raw, list)
        raw = raw[:-1]
        if not compaction_instruction:
            raise InvalidRequestError("compaction is not available on this endpoint", param=f"input[{len(raw)}]")
    conversation = [with_content(m) for m in convert_input(raw, history, table, tools, converted, sealer)]
    messages = list(conversation)
    if compaction_instruction:
        messages.append(compaction.instruction_message(compaction_instruction))
    if body.instructions:
        messages.insert(0, chat_pb2.Message(role="system", parts=[chat_pb2.Part(text=body.instructions)]))
    if not messages:
        raise InvalidRequestError("input must contain at least one message", param="input")
    if body.text and body.text.format and body.text.format.type != "text":
        log.debug("responses.text_format_ignored", format=body.text.format.type)
    sampling = sampling_params(max_tokens=body.max_output_tokens or 0, temperature=body.temperature, top_p=body.top_p)
    nvext = body.nvext
    identity, hints = identity_and_hints(
        headers, nvext.agent_context if nvext else None, nvext.agent_hints if nvext else None,
        prompt_cache_key=body.prompt_cache_key, closes_session=nvext is not None and nvext.closes_session(),
    )
    kwargs = template_kwargs(body)
    chat = chat_pb2.ChatRequest(
        request_id=request_id,
        model=model,
        messages=messages,
        tools=tools,
        tool_choice=_tool_choice(body, tools),
        sampling=sampling,
        identity=identity,
        hints=hints,
        chat_template_kwargs_json=json.dumps(kwargs) if kwargs else "",
    )
    return Converted(chat=chat, tools=table, history=conversation)
