"""``POST /v1/chat/completions``: streaming (SSE chunks, ``data: [DONE]``) and non-streaming."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from gateway.apis.openai_chat.convert import chat_request
from gateway.apis.openai_chat.encode import ChunkEncoder, sse_event
from gateway.apis.openai_chat.models import ChatCompletionRequest
from gateway.boundary import new_request_id
from gateway.converted_messages import ConvertedMessages, message_size
from gateway.parse_client import ParseClient
from gateway.streaming import Framing, TurnEndpoint, annotate_span, read_json

FRAMING = Framing(event=sse_event, end=b"data: [DONE]\n\n")


class ChatCompletions:
    """The chat completions endpoint over a ``ParseClient``.

    ``tool_dispatch``: stream each tool call dispatch as an ``event: tool_call_dispatch`` SSE event too;
    ``max_messages``: most messages a request may carry (0: any number).
    """

    def __init__(self, parse: ParseClient, *, tool_dispatch: bool = False, max_messages: int = 0) -> None:
        self._parse = parse
        self._tool_dispatch = tool_dispatch
        self._max_messages = max_messages
        self._endpoint = TurnEndpoint(FRAMING)
        self.converted = ConvertedMessages(message_size)  # a next turn converts only its new messages

    async def handle(self, request: Request) -> Response:
        json_body = await read_json(request, items="messages", max_items=self._max_messages)
        raw = json_body.value
        body = await json_body.validate(ChatCompletionRequest)
        public, info = await self._parse.resolve_model(body.model)
        completion_id = new_request_id(request, "chatcmpl-")
        chat = await json_body.run(lambda: chat_request(
            body, request.headers, model=info.served_model_name, request_id=completion_id,
            raw_messages=raw.get("messages"), converted=self.converted))
        annotate_span(chat)
        include_usage = bool(body.stream and body.stream_options and body.stream_options.include_usage)
        encoder = ChunkEncoder(completion_id, public, int(time.time()), include_usage=include_usage,
                               dispatch_events=self._tool_dispatch)
        return await self._endpoint.respond(request, self._parse.chat(chat), encoder, streaming=body.stream)
