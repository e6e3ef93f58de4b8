"""The public gRPC edge (``AgentService``) for custom harnesses: a validated pass-through to Parse."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from gateway.apis.grpc_edge.errors import abort, error_batch, redact
from gateway.auth import ApiKeys
from gateway.identity import resolve_identity
from gateway.parse_client import ParseClient
from services.api import chat_pb2, chat_pb2_grpc
from services.common import errors


class AgentServicer(chat_pb2_grpc.AgentServiceServicer):
    """``AgentService``: the canonical conversation in, the parse service's batches out unchanged.

    The identity follows ``gateway.identity``: the request's own ``Identity`` first, then call metadata
    (the same headers as HTTP), else a fresh session. A request without ``request_id`` gets one (it
    names the request in internal errors and in the mesh's logs). Errors before the first frame end
    the RPC with the category's status; after it they are sent in-band as an ``error`` event
    (``errors.py``). A cancelled RPC cancels the parse call.
    """

    def __init__(self, parse: ParseClient, keys: ApiKeys | None = None) -> None:
        self._parse = parse
        self._keys = keys or ApiKeys(())

    async def _authenticate(self, context: Any) -> None:
        """End the call UNAUTHENTICATED unless it carries an accepted key (as HTTP: bearer or x-api-key)."""
        if not self._keys.allows(_metadata(context)):
            await errors.abort_with(context, errors.UnauthenticatedError("Incorrect or missing API key."))

    async def Chat(
        self, request: chat_pb2.ChatRequest, context: Any
    ) -> AsyncIterator[chat_pb2.ChatEventBatch]:
        sent = False
        request_id = request.request_id or uuid.uuid4().hex
        await self._authenticate(context)
        try:
            if not request.messages:
                raise errors.InvalidRequestError("messages must not be empty", param="messages")
            _, info = await self._parse.resolve_model(request.model)
            forward = chat_pb2.ChatRequest()
            forward.CopyFrom(request)
            forward.request_id = request_id
            forward.model = info.served_model_name
            forward.identity.CopyFrom(resolve_identity(_metadata(context), request.identity))
            async with contextlib.aclosing(self._parse.chat(forward)) as stream:
                async for batch in stream:
                    sent = True
                    yield redact(batch, request_id)
        except Exception as exc:
            if not sent:
                await abort(context, exc, request_id)
                return
            yield error_batch(exc, request_id)

    async def GetModel(
        self, request: chat_pb2.ModelInfoRequest, context: Any
    ) -> chat_pb2.ModelInfo:
        await self._authenticate(context)
        try:
            info = await self._parse.get_model()
        except errors.MeshError as err:
            await abort(context, err, "model-" + uuid.uuid4().hex)
            raise  # unreachable: abort raises
        reply = chat_pb2.ModelInfo()
        reply.CopyFrom(info)
        reply.served_model_name = self._parse.public_name(info)
        return reply


def _metadata(context: Any) -> dict[str, str]:
    """Text metadata of the call as lower-case "headers" (identity falls back on them, like HTTP)."""
    return {str(key).lower(): str(value) for key, value in context.invocation_metadata() or ()
            if not str(key).endswith("-bin")}
