"""``POST /v1/responses``: the OpenAI Responses API, streaming (typed SSE events) and non-streaming;
``POST /v1/responses/compact``: a compaction (``compaction.py``); ``GET`` / ``DELETE /v1/responses/{id}``: a
stored response."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.apis.responses import compaction
from gateway.apis.responses.convert import Converted, chat_request, converted_runs
from gateway.apis.responses.encode import ResponseEncoder
from gateway.apis.responses.local_compaction import SessionTools
from gateway.apis.responses.models import ResponsesRequest
from gateway.apis.responses.store import ResponseStorage
from gateway.boundary import new_request_id
from gateway.catalog import ModelCatalog
from gateway.parse_client import ParseClient
from gateway.signing import SigningKey
from gateway.streaming import TYPED, JsonBody, TurnEndpoint, annotate_span, read_json
from services.api import chat_pb2
from services.common import errors

ENCRYPTED_REASONING = "reasoning.encrypted_content"


def _skeleton(body: ResponsesRequest, raw: dict[str, Any], response_id: str, model: str) -> dict[str, Any]:
    """The request echo every ``response`` object carries."""
    reasoning = body.reasoning
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {},
        "output": [],
        "parallel_tool_calls": body.parallel_tool_calls,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": reasoning.effort if reasoning else None,
                      "summary": reasoning.summary if reasoning else None},
        "store": body.store,
        "temperature": body.temperature if body.temperature is not None else 1.0,
        "text": {"format": {"type": "text"}, **(raw.get("text") or {})},
        "tool_choice": raw.get("tool_choice") or "auto",
        "tools": raw.get("tools") or [],
        "top_p": body.top_p if body.top_p is not None else 1.0,
        "truncation": "disabled",
        "usage": None,
        "user": body.user,
    }


class ResponsesApi:
    """The Responses endpoint over a ``ParseClient`` and a ``ResponseStorage`` (memory or JetStream).

    SSE frames carry ``event:`` lines (``TYPED``); there is no ``[DONE]`` and no keep-alive. ``max_items``:
    most input items a request may carry (0: any number). ``catalog``: each model's compaction instruction;
    ``signing_key``: seals compaction items (``--thinking-signature-key``).
    """

    def __init__(self, parse: ParseClient, store: ResponseStorage, *, max_items: int = 0,
                 catalog: ModelCatalog | None = None, signing_key: str | SigningKey = "") -> None:
        self._parse = parse
        self._store = store
        self._max_items = max_items
        self._catalog = catalog or ModelCatalog()
        self._sealer = compaction.compaction_sealer(signing_key)
        self._endpoint = TurnEndpoint(TYPED)
        self.converted = converted_runs()  # a next turn converts only its new items
        self.session_tools = SessionTools()  # Codex local compactions render with their conversation's tools

    async def create(self, request: Request) -> Response:
        json_body = await read_json(request, items="input", max_items=self._max_items)
        raw = json_body.value
        body = await json_body.validate(ResponsesRequest)
        public, info = await self._parse.resolve_model(body.model)
        if compaction.ends_with_trigger(body.input):
            return await self._compact(request, json_body, body, public, info, v1=False)
        tools_json = self.session_tools.tools_for(body.tools, body.prompt_cache_key, request.headers)
        history = await self._history(body)
        response_id = new_request_id(request, "resp_")
        converted = await json_body.run(lambda: chat_request(
            body, request.headers, history, model=info.served_model_name, request_id=response_id,
            converted=self.converted, sealer=self._sealer, tools_json=tools_json))
        annotate_span(converted.chat)
        include = set(body.include or ())
        encoder = ResponseEncoder(_skeleton(body, raw, response_id, public), converted.tools,
                                  include_encrypted=ENCRYPTED_REASONING in include)

        async def remember(response: dict[str, Any]) -> None:
            if body.store:
                await self._store.put(response["id"], [*converted.history, encoder.assistant_message()], response)

        return await self._endpoint.respond(request, self._parse.chat(converted.chat), encoder,
                                            streaming=body.stream, on_complete=remember)

    async def _history(self, body: ResponsesRequest) -> tuple[chat_pb2.Message, ...]:
        """The stored conversation ``previous_response_id`` names (none without one; unknown: a 400)."""
        if not body.previous_response_id:
            return ()
        stored = await self._store.get(body.previous_response_id)
        if stored is None:
            raise errors.InvalidRequestError(
                f"Previous response with id '{body.previous_response_id}' not found ({self._store.where}).",
                param="previous_response_id",
            )
        return stored.conversation

    async def compact(self, request: Request) -> Response:
        """``POST /v1/responses/compact``: the v1 compaction endpoint (never streamed)."""
        json_body = await read_json(request, items="input", max_items=self._max_items)
        body = await json_body.validate(ResponsesRequest)
        public, info = await self._parse.resolve_model(body.model)
        return await self._compact(request, json_body, body, public, info, v1=True)

    async def _compact(self, request: Request, json_body: JsonBody, body: ResponsesRequest, public: str,
                       info: chat_pb2.ModelInfo, *, v1: bool) -> Response:
        """A compaction (``compaction.py``): the conversation as its last turn rendered, then the model's
        compaction instruction; the answer is one sealed compaction item. Not stored."""
        instruction = self._catalog.profile(info, public).compaction_instruction
        response_id = new_request_id(request, "resp_")
        history = await self._history(body)
        converted: Converted = await json_body.run(lambda: chat_request(
            body, request.headers, history, model=info.served_model_name, request_id=response_id,
            converted=self.converted, sealer=self._sealer, compaction_instruction=instruction))
        annotate_span(converted.chat)
        items = body.input if isinstance(body.input, list) else [{"role": "user", "content": body.input}]
        encoder = compaction.CompactionEncoder(
            {**_skeleton(body, json_body.value, response_id, public), "store": False}, self._sealer,
            v1_output=compaction.user_messages(items) if v1 else None)
        return await self._endpoint.respond(request, self._parse.chat(converted.chat), encoder,
                                            streaming=body.stream and not v1)

    async def retrieve(self, request: Request) -> Response:
        """``GET /v1/responses/{response_id}``: the stored response object."""
        stored = await self._store.get(request.path_params["response_id"])
        if stored is None:
            raise self._not_found(request)
        return JSONResponse(stored.response)

    async def delete(self, request: Request) -> Response:
        """``DELETE /v1/responses/{response_id}``: forget a stored response."""
        response_id = request.path_params["response_id"]
        if not await self._store.delete(response_id):
            raise self._not_found(request)
        return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})

    def _not_found(self, request: Request) -> errors.NotFoundError:
        return errors.NotFoundError(
            f"No response with id '{request.path_params['response_id']}' found ({self._store.where}).")
