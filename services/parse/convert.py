"""Protobuf <-> domain conversions of the parse service (the only place besides service.py that sees _pb2)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from services.api import chat_pb2, common_pb2, worker_pb2
from services.common.errors import InvalidRequestError
from services.parse.conversation import (
    ChatMessage,
    Conversation,
    Part,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolSpec,
)
from services.parse.model_format import Prompt
from services.parse.parsers.events import (
    Event,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
)

# Deepest nesting accepted in a JSON text field: far beyond any real schema or arguments, well short of
# the recursion limit that ``json.loads`` and the template's ``tojson`` hit (a RecursionError is no 400).
MAX_JSON_DEPTH = 256
_STRINGS = re.compile(r'"(?:[^"\\]++|\\.)*+"')  # possessive: no backtracking on an unclosed string
_BRACKETS = re.compile(r"[\[\]{}]")


def check_json_depth(text: str, param: str) -> None:
    """Refuse JSON text nested deeper than :data:`MAX_JSON_DEPTH` (a 400 naming ``param``)."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return
    depth = 0
    for bracket in _BRACKETS.findall(_STRINGS.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        if depth > MAX_JSON_DEPTH:
            raise InvalidRequestError(f"{param} nests deeper than {MAX_JSON_DEPTH} levels", param=param)


def _check_json_fields(request: chat_pb2.ChatRequest, held: int) -> None:
    check_json_depth(request.chat_template_kwargs_json, "chat_template_kwargs_json")
    for i, tool in enumerate(request.tools):
        check_json_depth(tool.parameters_json, f"tools[{i}].parameters_json")
    for i, message in enumerate(request.messages, held):
        for j, part in enumerate(message.parts):
            if part.WhichOneof("kind") == "tool_call":
                check_json_depth(part.tool_call.arguments_json, f"messages[{i}].parts[{j}].tool_call.arguments_json")


def conversation_from_proto(request: chat_pb2.ChatRequest, held: Sequence[ChatMessage] = ()) -> Conversation:
    """The request's conversation; JSON text fields nested too deeply to parse are a 400 naming the field.

    ``held``: the conversation's messages before ``request.messages``, converted by an earlier request
    (``services.common.message_reuse``): the same objects, so the renderer's per-message work is reused too.
    """
    _check_json_fields(request, len(held))
    return Conversation(
        messages=(*held, *map(_message, request.messages)),
        tools=tuple(ToolSpec(t.name, t.description, t.parameters_json) for t in request.tools),
        template_kwargs_json=request.chat_template_kwargs_json,
        add_generation_prompt=(
            request.add_generation_prompt
            if request.HasField("add_generation_prompt")
            else not request.continue_final_message
        ),
        continue_final_message=request.continue_final_message,
        strip_billing_header=request.strip_billing_header if request.HasField("strip_billing_header") else None,
    )


def _message(message: chat_pb2.Message) -> ChatMessage:
    parts: list[Part] = []
    for part in message.parts:
        kind = part.WhichOneof("kind")
        if kind == "text":
            parts.append(TextPart(part.text))
        elif kind == "reasoning":
            parts.append(ReasoningPart(part.reasoning))
        elif kind == "tool_call":
            call = part.tool_call
            parts.append(ToolCallPart(call.id, call.name, call.arguments_json))
    return ChatMessage(
        role=message.role,
        parts=tuple(parts),
        tool_call_id=message.tool_call_id,
        name=message.name,
        is_error=message.is_error,
    )


def message_size(message: ChatMessage) -> int:
    """About the bytes ``message`` takes in memory, objects included (what a message store counts against its
    bound)."""
    return 200 + sum(100 + (len(p.arguments_json) + len(p.name) if isinstance(p, ToolCallPart) else len(p.text))
                     for p in message.parts)


def generate_request(
    request: chat_pb2.ChatRequest, prompt: Prompt, *, request_id: str, model: str, stop_token_ids: tuple[int, ...]
) -> worker_pb2.GenerateRequest:
    """The router's request for ``prompt``, less the prompt's ids: they go with the stream, packed
    (``ReusingStub.Generate``), or into ``token_ids_u32`` by a caller that sends the message as it is."""
    out = worker_pb2.GenerateRequest(
        request_id=request_id,
        model=model,
        match_text=prompt.match_text,
        stop_token_ids=stop_token_ids,
    )
    out.sampling.CopyFrom(request.sampling)
    out.identity.CopyFrom(request.identity)
    out.hints.CopyFrom(request.hints)
    return out


def event_to_proto(event: Event) -> chat_pb2.ChatEvent:
    if isinstance(event, ReasoningDelta):
        return chat_pb2.ChatEvent(reasoning_delta=chat_pb2.ReasoningDelta(text=event.text))
    if isinstance(event, TextDelta):
        return chat_pb2.ChatEvent(text_delta=chat_pb2.TextDelta(text=event.text))
    if isinstance(event, ToolCallStart):
        return chat_pb2.ChatEvent(
            tool_call_start=chat_pb2.ToolCallStart(index=event.index, id=event.id, name=event.name)
        )
    if isinstance(event, ToolCallArgumentsDelta):
        return chat_pb2.ChatEvent(
            tool_call_arguments_delta=chat_pb2.ToolCallArgumentsDelta(index=event.index, id=event.id, delta=event.delta)
        )
    call = chat_pb2.ToolCall(id=event.id, name=event.name, arguments_json=event.arguments_json)
    return chat_pb2.ChatEvent(tool_call_dispatch=chat_pb2.ToolCallDispatch(index=event.index, call=call))


def started_event(request_id: str, model: str, info: worker_pb2.PromptInfo) -> chat_pb2.ChatEvent:
    return chat_pb2.ChatEvent(started=chat_pb2.Started(
        request_id=request_id,
        model=model,
        prompt_tokens=info.prompt_tokens,
        cached_tokens=info.cached_tokens,
        worker_id=info.worker_id,
    ))


def finish_events(
    frame: worker_pb2.GenerateResponse, *, tool_calls: int, reasoning_tokens: int = 0
) -> list[chat_pb2.ChatEvent]:
    """Usage and Finish; a turn that made tool calls and ended normally finishes with TOOL_CALLS.

    ``reasoning_tokens`` (the parse service's count, see ``reasoning_tokens.py``) fills the usage's
    ``reasoning_tokens``, never more than its completion tokens (where the engine reported them).
    """
    reason = frame.finish_reason
    if tool_calls and reason == common_pb2.FINISH_REASON_STOP and not frame.stop_string:
        reason = common_pb2.FINISH_REASON_TOOL_CALLS
    usage = common_pb2.Usage()
    usage.CopyFrom(frame.usage)
    if reasoning_tokens:
        done = usage.completion_tokens
        usage.reasoning_tokens = min(reasoning_tokens, done) if done else reasoning_tokens
    return [
        chat_pb2.ChatEvent(usage=usage),
        chat_pb2.ChatEvent(finish=chat_pb2.Finish(reason=reason, stop_string=frame.stop_string)),
    ]


def error_event(error: common_pb2.Error) -> chat_pb2.ChatEvent:
    return chat_pb2.ChatEvent(error=error)
