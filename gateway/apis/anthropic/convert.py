"""Anthropic Messages request (pydantic) + HTTP headers -> the canonical ``ChatRequest``.

The same conversion feeds ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``, so the count
is exactly the prompt a real request sends the worker (system, tools, thinking config, strip).

Mapping:
- ``system`` (string or text blocks) -> a leading system message, one part per block.
- ``role: "system"`` messages inside ``messages`` stay where they are (Claude Code puts one at
  ``messages[1]`` and keeps it there), so the rendered prefix only ever grows.
- assistant blocks -> ordered parts: ``thinking`` -> reasoning, ``text`` -> text, ``tool_use`` -> tool
  call (arguments as JSON text); ``redacted_thinking`` has nothing readable and is not rendered. A turn
  without text blocks has content "" (``canonical.with_content``; docs/conversation-mapping.md).
- tool-use ids: the ``toolu_X`` ids we hand out are the mesh's ``call_X`` again (``tool_use.id`` and
  ``tool_use_id`` alike, ``encode.mesh_call_id``); other ids are kept as sent.
- user ``tool_result`` blocks -> ``tool`` messages in order (``is_error`` kept); user text between them
  -> user messages. Images and documents are a 400: no model behind this gateway reads them.
- ``thinking`` -> ``enable_thinking`` (+ ``thinking_budget``), ``output_config.effort`` ->
  ``reasoning_effort``, ``context_management`` ``clear_thinking`` -> which turns keep their reasoning.
- a final assistant message is a prefill: the model continues it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from gateway.apis.anthropic.encode import mesh_call_id
from gateway.apis.anthropic.models import (
    ContextManagement,
    CountTokensRequest,
    ImageBlock,
    Message,
    MessagesRequest,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    Tool,
    ToolChoice,
    ToolResultBlock,
    ToolUseBlock,
)
from gateway.apis.canonical import identity_and_hints, sampling_params, with_content
from gateway.converted_messages import ConvertedMessages
from services.api import chat_pb2, common_pb2
from services.common.errors import InvalidRequestError

TRUNCATE_KWARG = "truncate_history_thinking"  # the parse service's reasoning-history template kwarg
STRIP_HEADER = "x-harnessmesh-strip-anthropic-preamble"  # per-request override of --strip-anthropic-preamble
def strip_preamble(headers: Mapping[str, str], default: bool) -> bool:
    raw = headers.get(STRIP_HEADER, "").strip().lower()
    if not raw:
        return default
    return raw in ("1", "true", "yes", "on")


def _image_error(param: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"{param}: this model does not accept images or documents (text only)", param=param
    )


def _kept_thinking_turns(body: CountTokensRequest) -> int | None:
    """How many of the latest assistant turns keep their thinking (None: all of them)."""
    cm: ContextManagement | None = body.context_management
    for edit in cm.edits if cm else ():
        if edit.type.startswith("clear_thinking"):
            if edit.keep == "all":
                return None
            return edit.keep.value if edit.keep is not None else 1
    return None


def _assistant(msg: Message, i: int, keep_thinking: bool) -> chat_pb2.Message:
    out = chat_pb2.Message(role="assistant")
    if isinstance(msg.content, str):
        out.parts.append(chat_pb2.Part(text=msg.content))
        return out
    for j, block in enumerate(msg.content):
        param = f"messages.{i}.content.{j}"
        if isinstance(block, TextBlock):
            out.parts.append(chat_pb2.Part(text=block.text))
        elif isinstance(block, ThinkingBlock):
            if keep_thinking:
                out.parts.append(chat_pb2.Part(reasoning=block.thinking))
        elif isinstance(block, ToolUseBlock):
            args = json.dumps(block.input, ensure_ascii=False)
            call = chat_pb2.ToolCall(id=mesh_call_id(block.id), name=block.name, arguments_json=args)
            out.parts.append(chat_pb2.Part(tool_call=call))
        elif isinstance(block, RedactedThinkingBlock):
            continue
        elif isinstance(block, ImageBlock):
            raise _image_error(param)
        else:
            raise InvalidRequestError(f"{param}.type: {block.type!r} is not allowed in assistant messages",
                                      param=f"{param}.type")
    return with_content(out)


def _user(msg: Message, i: int, tool_names: Mapping[str, str]) -> Iterator[chat_pb2.Message]:
    role = msg.role
    if isinstance(msg.content, str):
        yield chat_pb2.Message(role=role, parts=[chat_pb2.Part(text=msg.content)])
        return
    pending: list[chat_pb2.Part] = []
    for j, block in enumerate(msg.content):
        param = f"messages.{i}.content.{j}"
        if isinstance(block, TextBlock):
            pending.append(chat_pb2.Part(text=block.text))
        elif isinstance(block, ToolResultBlock) and role == "user":
            if pending:
                yield chat_pb2.Message(role=role, parts=pending)
                pending = []
            yield _tool_result(block, param, tool_names)
        elif isinstance(block, ImageBlock):
            raise _image_error(param)
        else:
            raise InvalidRequestError(f"{param}.type: {block.type!r} is not allowed in {role} messages",
                                      param=f"{param}.type")
    if pending or not msg.content:
        yield chat_pb2.Message(role=role, parts=pending or [chat_pb2.Part(text="")])


def _tool_result(block: ToolResultBlock, param: str, tool_names: Mapping[str, str]) -> chat_pb2.Message:
    call_id = mesh_call_id(block.tool_use_id)
    out = chat_pb2.Message(role="tool", tool_call_id=call_id, is_error=block.is_error,
                           name=tool_names.get(call_id, ""))
    content = block.content
    if content is None or isinstance(content, str):
        out.parts.append(chat_pb2.Part(text=content or ""))
        return out
    for k, inner in enumerate(content):
        if isinstance(inner, ImageBlock):
            raise _image_error(f"{param}.content.{k}")
        out.parts.append(chat_pb2.Part(text=inner.text))
    if not content:
        out.parts.append(chat_pb2.Part(text=""))
    return out


class ConvertedMessage(NamedTuple):
    """One Messages API message converted: its canonical messages (a user message with tool results becomes
    several) and the tool calls ``(id, name)`` it makes, which name the tool results after it."""

    messages: tuple[chat_pb2.Message, ...]
    tool_calls: tuple[tuple[str, str], ...]


def converted_messages() -> ConvertedMessages[ConvertedMessage]:
    """A memo of recent conversations' converted messages for :func:`chat_request`."""
    return ConvertedMessages(lambda one: sum(m.ByteSize() for m in one.messages))


def convert_messages(body: CountTokensRequest, raw_messages: Sequence[Any] | None = None,
                     converted: ConvertedMessages[ConvertedMessage] | None = None) -> list[chat_pb2.Message]:
    """The canonical messages of ``body``. With ``converted`` and the body's ``raw_messages`` (as parsed, before
    validation), messages equal to a recent request's are not converted again (``gateway.converted_messages``):
    an assistant message's key is its JSON and whether it keeps its thinking (``clear_thinking`` moves that)."""
    out: list[chat_pb2.Message] = []
    if body.system is not None:
        blocks = [body.system] if isinstance(body.system, str) else [b.text for b in body.system]
        if blocks:
            out.append(chat_pb2.Message(role="system", parts=[chat_pb2.Part(text=t) for t in blocks]))
    keep = _kept_thinking_turns(body)
    turns = [i for i, m in enumerate(body.messages) if m.role == "assistant"]
    thinking_from = 0  # index of the first message whose thinking is rendered
    if keep is not None and keep < len(turns):
        thinking_from = turns[-keep] if keep else len(body.messages)
    tool_names: dict[str, str] = {}

    def convert_one(i: int) -> ConvertedMessage:
        msg = body.messages[i]
        if msg.role == "assistant":
            message = _assistant(msg, i, keep_thinking=i >= thinking_from)
            calls = tuple((p.tool_call.id, p.tool_call.name) for p in message.parts
                          if p.WhichOneof("kind") == "tool_call")
            tool_names.update(calls)
            return ConvertedMessage((message,), calls)
        return ConvertedMessage(tuple(_user(msg, i, tool_names)), ())

    if converted is None or raw_messages is None or len(raw_messages) != len(body.messages):
        converted_all = [convert_one(i) for i in range(len(body.messages))]
    else:
        keys = [(raw, i >= thinking_from) if msg.role == "assistant" else raw
                for i, (raw, msg) in enumerate(zip(raw_messages, body.messages, strict=True))]

        def resume(reused: Sequence[ConvertedMessage]) -> None:
            for one in reused:
                tool_names.update(one.tool_calls)

        converted_all = converted.convert(keys, convert_one, resume)
    for one in converted_all:
        out.extend(one.messages)
    return out


def convert_tools(tools: Sequence[Tool] | None) -> list[chat_pb2.Tool]:
    """Client tools with an ``input_schema``; deferred (``defer_loading``) and server tools are not shown."""
    out = []
    for tool in tools or ():
        if tool.defer_loading or (tool.input_schema is None and tool.type not in (None, "custom")):
            continue
        schema = tool.input_schema or {"type": "object", "properties": {}}
        out.append(chat_pb2.Tool(name=tool.name, description=tool.description or "",
                                 parameters_json=json.dumps(schema, ensure_ascii=False)))
    return out


def convert_tool_choice(choice: ToolChoice | None, tools: Sequence[chat_pb2.Tool]) -> chat_pb2.ToolChoice:
    if choice is None or choice.type == "auto":
        return chat_pb2.ToolChoice(mode="auto")
    if choice.type == "none":
        return chat_pb2.ToolChoice(mode="none")
    if not tools:
        raise InvalidRequestError(f"tool_choice.type: {choice.type!r} needs tools", param="tool_choice.type")
    if choice.type == "any":
        return chat_pb2.ToolChoice(mode="required")
    if not choice.name or choice.name not in {t.name for t in tools}:
        raise InvalidRequestError(f"tool_choice.name: {choice.name!r} is not one of the request's tools",
                                  param="tool_choice.name")
    return chat_pb2.ToolChoice(mode="named", name=choice.name)


def template_kwargs(body: CountTokensRequest) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if body.thinking is not None:
        if body.thinking.type == "disabled":
            kwargs["enable_thinking"] = False
        elif body.thinking.type == "enabled":
            kwargs["enable_thinking"] = True
            if body.thinking.budget_tokens is not None:
                kwargs["thinking_budget"] = body.thinking.budget_tokens
    if body.output_config is not None and body.output_config.effort:
        kwargs["reasoning_effort"] = body.output_config.effort
    cm = body.context_management
    if cm and any(e.type.startswith("clear_thinking") for e in cm.edits):
        kwargs[TRUNCATE_KWARG] = False  # the gateway already dropped what the client asked to clear
    return kwargs


def thinking_blocks(body: CountTokensRequest) -> Iterator[tuple[str, str]]:
    """(thinking, signature) of every replayed thinking block."""
    for msg in body.messages:
        if msg.role == "assistant" and not isinstance(msg.content, str):
            for block in msg.content:
                if isinstance(block, ThinkingBlock):
                    yield block.thinking, block.signature


def chat_request(
    body: CountTokensRequest, headers: Mapping[str, str], *, model: str, request_id: str, strip: bool,
    raw_messages: Sequence[Any] | None = None, converted: ConvertedMessages[ConvertedMessage] | None = None,
) -> chat_pb2.ChatRequest:
    """The canonical request for a Messages (or count_tokens) body (``raw_messages`` and ``converted``: see
    :func:`convert_messages`)."""
    tools = convert_tools(body.tools)
    identity, hints = identity_and_hints(headers, None, None,
                                         user_id=body.metadata.user_id if body.metadata else None)
    sampling = common_pb2.SamplingParams()
    if isinstance(body, MessagesRequest):
        sampling = sampling_params(max_tokens=body.max_tokens, stop=body.stop_sequences or (),
                                   temperature=body.temperature, top_p=body.top_p, top_k=body.top_k)
    if not body.messages:
        raise InvalidRequestError("messages: at least one message is required", param="messages")
    kwargs = template_kwargs(body)
    prefill = body.messages[-1].role == "assistant"
    return chat_pb2.ChatRequest(
        request_id=request_id,
        model=model,
        messages=convert_messages(body, raw_messages, converted),
        tools=tools,
        tool_choice=convert_tool_choice(body.tool_choice, tools),
        sampling=sampling,
        identity=identity,
        hints=hints,
        chat_template_kwargs_json=json.dumps(kwargs) if kwargs else "",
        add_generation_prompt=not prefill,
        continue_final_message=prefill,
        strip_billing_header=strip,
    )
