"""vLLM-compatible ``POST /tokenize`` and ``POST /detokenize`` via the parse service.

Chat input goes through the same conversion as ``/v1/chat/completions``, so the token ids are
exactly what a chat request would send the worker.
"""

from __future__ import annotations

import json
import uuid

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.apis.canonical import identity_and_hints
from gateway.apis.openai_chat.convert import convert_message, convert_tools
from gateway.apis.openai_chat.models import DetokenizeRequest, TokenizeChatRequest, TokenizePromptRequest
from gateway.parse_client import ParseClient
from gateway.streaming import read_json
from services.api import chat_pb2, parse_pb2
from services.common import errors


class TokenizeApi:
    """``/tokenize`` and ``/detokenize`` over a ``ParseClient``; ``max_messages`` as for chat (0: any number)."""

    def __init__(self, parse: ParseClient, *, max_messages: int = 0) -> None:
        self._parse = parse
        self._max_messages = max_messages

    async def tokenize(self, request: Request) -> Response:
        json_body = await read_json(request, items="messages", max_items=self._max_messages)
        raw = json_body.value
        if not isinstance(raw, dict):
            raise errors.InvalidRequestError("request body must be a JSON object")
        if "messages" in raw:
            body = await json_body.validate(TokenizeChatRequest)
            _, info = await self._parse.resolve_model(body.model)
            chat = await json_body.run(lambda: _chat(body, request.headers, info.served_model_name))
            tok = parse_pb2.TokenizeRequest(chat=chat)
        elif "prompt" in raw:
            prompt_body = TokenizePromptRequest.model_validate(raw)
            await self._parse.resolve_model(prompt_body.model)
            tok = parse_pb2.TokenizeRequest(
                prompt=prompt_body.prompt, add_special_tokens=prompt_body.add_special_tokens
            )
        else:
            raise errors.InvalidRequestError("give either messages or prompt", param="messages")
        reply = await self._parse.tokenize(tok)
        tokens = list(reply.token_ids)
        return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": reply.max_model_len})

    async def detokenize(self, request: Request) -> Response:
        body = DetokenizeRequest.model_validate((await read_json(request)).value)
        await self._parse.resolve_model(body.model)
        return JSONResponse({"prompt": await self._parse.detokenize(body.tokens)})


def _chat(body: TokenizeChatRequest, headers: Headers, model: str) -> chat_pb2.ChatRequest:
    identity, hints = identity_and_hints(headers, None, None)
    return chat_pb2.ChatRequest(
        request_id="tok-" + uuid.uuid4().hex,
        model=model,
        messages=[convert_message(m, i) for i, m in enumerate(body.messages)],
        tools=convert_tools(body.tools),
        tool_choice=chat_pb2.ToolChoice(mode="auto"),
        identity=identity,
        hints=hints,
        chat_template_kwargs_json=json.dumps(body.chat_template_kwargs) if body.chat_template_kwargs else "",
        add_generation_prompt=body.add_generation_prompt and not body.continue_final_message,
        continue_final_message=body.continue_final_message,
    )
