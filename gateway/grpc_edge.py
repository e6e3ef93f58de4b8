"""The public gRPC edge (``AgentService``) for custom harnesses: a validated pass-through to Parse."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import structlog

from gateway.identity import resolve_identity
from gateway.parse_client import ParseClient
from services.api import chat_pb2, chat_pb2_grpc
from services.common import errors

log = structlog.get_logger()


class AgentServicer(chat_pb2_grpc.AgentServiceServicer):
    """``AgentService``: the canonical conversation in, the parse service's batches out unchanged.

    The identity follows ``gateway.identity``: the request's own ``Identity`` first, then call metadata
    (the same headers as HTTP), else a fresh session. Errors before the first frame end the RPC with
    the category's status; after it they are sent in-band as an ``error`` event. A cancelled RPC cancels the parse call.
    """

    def __init__(self, parse: ParseClient) -> None:
        self._parse = parse

    async def Chat(
        self, request: chat_pb2.ChatRequest, context: Any
    ) -> AsyncIterator[chat_pb2.ChatEventBatch]:
        sent = False
        try:
            if not request.messages:
                raise errors.InvalidRequestError("messages must not be empty", param="messages")
            _, info = await self._parse.resolve_model(request.model)
            forward = chat_pb2.ChatRequest()
            forward.CopyFrom(request)
            forward.model = info.served_model_name
            forward.identity.CopyFrom(resolve_identity(_metadata(context), request.identity))
            async with contextlib.aclosing(self._parse.chat(forward)) as stream:
                async for batch in stream:
                    sent = True
                    yield batch
        except Exception as exc:
            err = errors.as_mesh_error(exc)
            if isinstance(err, errors.InternalError):
                log.exception("gateway.grpc_chat_failed", error=err.message)
            if not sent:
                await errors.abort_with(context, err)
                return
            yield chat_pb2.ChatEventBatch(events=[chat_pb2.ChatEvent(error=errors.to_proto(err))])

    async def GetModel(
        self, request: chat_pb2.ModelInfoRequest, context: Any
    ) -> chat_pb2.ModelInfo:
        try:
            info = await self._parse.get_model()
        except errors.MeshError as err:
            await errors.abort_with(context, err)
            raise  # unreachable: abort raises
        reply = chat_pb2.ModelInfo()
        reply.CopyFrom(info)
        reply.served_model_name = self._parse.public_name(info)
        return reply


def _metadata(context: Any) -> dict[str, str]:
    """Text metadata of the call as lower-case "headers" (identity falls back on them, like HTTP)."""
    return {str(key).lower(): str(value) for key, value in context.invocation_metadata() or ()
            if not str(key).endswith("-bin")}
