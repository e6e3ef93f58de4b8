"""The public gRPC edge (``AgentService``) for custom harnesses: a validated pass-through to Parse."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from gateway.apis.canonical import header_closes_session
from gateway.apis.grpc_edge.access import AccessLine
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
        self, request: chat_pb2.ChatRequest | Undecodable, context: Any
    ) -> AsyncIterator[chat_pb2.ChatEventBatch]:
        await self._authenticate(context)
        if isinstance(request, Undecodable):
            await errors.abort_with(context, request.error("ChatRequest"))
            return
        sent = False
        request_id = request.request_id or uuid.uuid4().hex
        access = AccessLine(request_id)
        try:
            if not request.messages:
                raise errors.InvalidRequestError("messages must not be empty", param="messages")
            if request.model:
                access.fields["requested_model"] = request.model  # a 404's line names what nothing serves
            resolution, info = await self._parse.resolve(request.model)
            resolution.annotate_span()
            access.fields.update(resolution.access_fields())
            forward = chat_pb2.ChatRequest()
            forward.CopyFrom(request)
            forward.request_id = request_id
            forward.model = info.served_model_name
            forward.identity.CopyFrom(resolve_identity(_metadata(context), request.identity))
            if header_closes_session(_metadata(context)):  # as HTTP: Dynamo's header closes the session too
                forward.hints.session_final = True
            access.identity = forward.identity
            async with contextlib.aclosing(self._parse.chat(forward)) as stream:
                async for batch in stream:
                    sent = True
                    access.observe(batch)
                    yield redact(batch, request_id)
        except (asyncio.CancelledError, GeneratorExit):
            access.cancelled()
            raise
        except Exception as exc:
            access.failed(exc)
            if not sent:
                await abort(context, exc, request_id)
                return
            yield error_batch(exc, request_id)
        finally:
            access.write()

    async def GetModel(
        self, request: chat_pb2.ModelInfoRequest | Undecodable, context: Any
    ) -> chat_pb2.ModelInfo:
        await self._authenticate(context)
        if isinstance(request, Undecodable):
            await errors.abort_with(context, request.error("ModelInfoRequest"))
        try:
            info = await self._parse.get_model()
        except errors.MeshError as err:
            await abort(context, err, "model-" + uuid.uuid4().hex)
            raise  # unreachable: abort raises
        reply = chat_pb2.ModelInfo()
        reply.CopyFrom(info)
        reply.served_model_name = self._parse.public_name(info)
        reply.ClearField("accepts_messages_base")  # between gateway and parse only
        return reply


@dataclass(frozen=True)
class Undecodable:
    """Request bytes that are not the method's message. gRPC would answer them UNKNOWN before any handler
    runs; registered through :func:`add_agent_service` they reach the servicer, which answers INVALID_ARGUMENT."""

    reason: str

    def error(self, message: str) -> errors.InvalidRequestError:
        return errors.InvalidRequestError(f"the request is not a valid harnessmesh.v1.{message}: {self.reason}")


def _tolerant(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as exc:  # also invalid UTF-8 in a string field
            return Undecodable(str(exc) or "malformed protobuf")
    return deserialize


def add_agent_service(servicer: AgentServicer, server: Any) -> None:
    """Serve ``AgentService`` on ``server``: ``add_AgentServiceServicer_to_server`` with request parsing that
    turns undecodable bytes into :class:`Undecodable` (INVALID_ARGUMENT) instead of gRPC's UNKNOWN."""
    handlers = {
        "Chat": grpc.unary_stream_rpc_method_handler(
            servicer.Chat, request_deserializer=_tolerant(chat_pb2.ChatRequest.FromString),
            response_serializer=chat_pb2.ChatEventBatch.SerializeToString),
        "GetModel": grpc.unary_unary_rpc_method_handler(
            servicer.GetModel, request_deserializer=_tolerant(chat_pb2.ModelInfoRequest.FromString),
            response_serializer=chat_pb2.ModelInfo.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("harnessmesh.v1.AgentService", handlers),))
    server.add_registered_method_handlers("harnessmesh.v1.AgentService", handlers)


def _metadata(context: Any) -> dict[str, str]:
    """Text metadata of the call as lower-case "headers" (identity falls back on them, like HTTP)."""
    return {str(key).lower(): str(value) for key, value in context.invocation_metadata() or ()
            if not str(key).endswith("-bin")}
