"""``POST /v1/messages`` (streaming and not) and ``POST /v1/messages/count_tokens``."""

from __future__ import annotations

from typing import TypeVar

import structlog
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.apis.anthropic.cache_control import cache_ttl_s
from gateway.apis.anthropic.convert import chat_request, converted_messages, strip_preamble, thinking_blocks
from gateway.apis.anthropic.encode import MessageEncoder
from gateway.apis.anthropic.errors import from_validation_error
from gateway.apis.anthropic.models import CountTokensRequest, MessagesRequest
from gateway.apis.anthropic.signing import ThinkingSigner
from gateway.boundary import new_request_id
from gateway.parse_client import ParseClient
from gateway.streaming import TYPED, Framing, JsonBody, TurnEndpoint, annotate_span, read_json
from services.api import chat_pb2, parse_pb2

log = structlog.get_logger()
_Body = TypeVar("_Body", bound=CountTokensRequest)

# ``event: <type>`` frames, no ``[DONE]``; a ``ping`` on long gaps (a parallel request's prefill, a slow step).
FRAMING = Framing(event=TYPED.event, keep_alive={"type": "ping"})


class MessagesApi:
    """The Anthropic Messages endpoints over a ``ParseClient``.

    ``strip`` is the default of the billing-header strip (``--strip-anthropic-preamble``);
    ``ping_interval`` is the longest silence of a stream before a ``ping`` event; ``max_messages``: most
    messages a request may carry (0: any number).
    """

    def __init__(
        self,
        parse: ParseClient,
        signer: ThinkingSigner,
        *,
        strip: bool = True,
        ping_interval: float = 10.0,
        max_messages: int = 0,
    ) -> None:
        self._parse = parse
        self._signer = signer
        self._strip = strip
        self._max_messages = max_messages
        self.endpoint = TurnEndpoint(FRAMING, keep_alive_interval=ping_interval)
        self.converted = converted_messages()  # a next turn converts only its new messages

    async def _body(self, request: Request, cls: type[_Body]) -> tuple[JsonBody, _Body]:
        json_body = await read_json(request, items="messages", max_items=self._max_messages)
        try:
            return json_body, await json_body.validate(cls)
        except ValidationError as exc:
            raise from_validation_error(exc) from exc

    async def _convert(self, json_body: JsonBody, body: CountTokensRequest, request: Request, request_id: str
                       ) -> tuple[str, chat_pb2.ChatRequest]:
        public, info = await self._parse.resolve_model(body.model)
        strip = strip_preamble(request.headers, self._strip)
        chat = await json_body.run(lambda: chat_request(
            body, request.headers, model=info.served_model_name, request_id=request_id, strip=strip,
            raw_messages=json_body.value.get("messages"), converted=self.converted))
        chat.hints.cache_ttl_s = cache_ttl_s(json_body.value)
        annotate_span(chat)
        return public, chat

    async def count_tokens(self, request: Request) -> Response:
        json_body, body = await self._body(request, CountTokensRequest)
        _, chat = await self._convert(json_body, body, request, new_request_id(request, "count-"))
        reply = await self._parse.tokenize(parse_pb2.TokenizeRequest(chat=chat))
        return JSONResponse({"input_tokens": len(reply.token_ids)})

    async def messages(self, request: Request) -> Response:
        json_body, body = await self._body(request, MessagesRequest)
        message_id = new_request_id(request, "msg_")
        public, chat = await self._convert(json_body, body, request, message_id)
        verdicts = self._signer.verdicts(thinking_blocks(body))
        if verdicts and set(verdicts) != {"valid"}:
            log.info("gateway.anthropic.thinking_signatures", request_id=message_id, verdicts=dict(verdicts))
        encoder = MessageEncoder(message_id, public, self._signer)
        return await self.endpoint.respond(request, self._parse.chat(chat), encoder, streaming=body.stream)
