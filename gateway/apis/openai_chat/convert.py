"""OpenAI chat request (pydantic) + HTTP headers -> the canonical ``ChatRequest``.

The same conversion feeds ``/v1/chat/completions`` and ``/tokenize``, so the tokens reported by
``/tokenize`` are exactly those a chat request sends the worker.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.apis.canonical import identity_and_hints, mode_tool_choice, named_tool_choice, sampling_params
from gateway.apis.openai_chat.models import (
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    NamedToolChoice,
    ToolDef,
)
from gateway.converted_messages import ConvertedMessages
from services.api import chat_pb2
from services.common.errors import InvalidRequestError


def _content_text(content: str | list[ContentPart] | None, param: str) -> str | None:
    """The message's content as text: None when the client sent none (null or absent), parts joined in order."""
    if content is None or isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type not in ("text", "input_text", "output_text"):
            raise InvalidRequestError(
                f"content part type {part.type!r} is not supported (only text)", param=f"{param}[{j}].type"
            )
        texts.append(part.text or "")
    return "".join(texts)


def convert_message(msg: ChatMessage, i: int) -> chat_pb2.Message:
    """One OpenAI message as a canonical message with ordered parts.

    What a template can observe is kept (docs/conversation-mapping.md): content "" is a text part "",
    null or absent content is no text part; likewise reasoning; a tool call's id is the client's (none: none).
    """
    param = f"messages[{i}]"
    out = chat_pb2.Message(role=msg.role)
    text = _content_text(msg.content, f"{param}.content")
    if msg.role == "assistant":
        reasoning = msg.reasoning_content if msg.reasoning_content is not None else msg.reasoning
        if reasoning is not None:
            out.parts.append(chat_pb2.Part(reasoning=reasoning))
        if text is not None:
            out.parts.append(chat_pb2.Part(text=text))
        for call in msg.tool_calls or ():
            args = call.function.arguments
            args_json = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            call_part = chat_pb2.ToolCall(id=call.id, name=call.function.name, arguments_json=args_json)
            out.parts.append(chat_pb2.Part(tool_call=call_part))
        return out
    if msg.role == "tool":
        if not msg.tool_call_id:
            raise InvalidRequestError("tool messages need a tool_call_id", param=f"{param}.tool_call_id")
        out.tool_call_id = msg.tool_call_id
        if msg.name:
            out.name = msg.name
    if text is not None:
        out.parts.append(chat_pb2.Part(text=text))
    return out


def convert_tools(tools: Sequence[ToolDef] | None) -> list[chat_pb2.Tool]:
    return [
        chat_pb2.Tool(
            name=t.function.name,
            description=t.function.description or "",
            parameters_json=json.dumps(t.function.parameters or {"type": "object", "properties": {}}),
        )
        for t in tools or ()
    ]


def convert_tool_choice(
    choice: str | NamedToolChoice | None, tools: Sequence[chat_pb2.Tool]
) -> chat_pb2.ToolChoice:
    if choice is None:
        return chat_pb2.ToolChoice(mode="auto")
    if isinstance(choice, str):
        return mode_tool_choice(choice, tools)
    return named_tool_choice(choice.function.name, tools, param="tool_choice")


def chat_request(
    body: ChatCompletionRequest, headers: Mapping[str, str], *, model: str, request_id: str,
    raw_messages: Sequence[Any] | None = None, converted: ConvertedMessages[chat_pb2.Message] | None = None,
) -> chat_pb2.ChatRequest:
    """The canonical request for an OpenAI chat completion request. With ``converted`` and the body's
    ``raw_messages`` (as parsed, before validation), messages equal to a recent request's are not converted
    again (``gateway.converted_messages``)."""
    tools = convert_tools(body.tools)
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or ())
    sampling = sampling_params(
        max_tokens=body.max_completion_tokens or body.max_tokens or 0, stop=stop, temperature=body.temperature,
        top_p=body.top_p, top_k=body.top_k, seed=body.seed, ignore_eos=body.ignore_eos,
    )
    nvext = body.nvext
    identity, hints = identity_and_hints(
        headers, nvext.agent_context if nvext else None, nvext.agent_hints if nvext else None,
        closes_session=nvext is not None and nvext.closes_session(),
    )
    return chat_pb2.ChatRequest(
        request_id=request_id,
        model=model,
        messages=(converted.convert(raw_messages, lambda i: convert_message(body.messages[i], i))
                  if converted is not None and raw_messages is not None and len(raw_messages) == len(body.messages)
                  else [convert_message(m, i) for i, m in enumerate(body.messages)]),
        tools=tools,
        tool_choice=convert_tool_choice(body.tool_choice, tools),
        sampling=sampling,
        identity=identity,
        hints=hints,
        chat_template_kwargs_json=json.dumps(body.chat_template_kwargs) if body.chat_template_kwargs else "",
        add_generation_prompt=body.add_generation_prompt and not body.continue_final_message,
        continue_final_message=body.continue_final_message,
    )
