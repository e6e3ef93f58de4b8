"""The gRPC edge's error boundary: mesh errors as gRPC statuses before the first frame, ``error`` events after.

The mapping itself is the mesh's (``services.common.errors``: ``abort_with``, ``to_proto``); what is
added here is what every API does at its boundary: ``gateway.boundary.public_error`` first, so an
internal error — raised here, or sent in-band by the parse service — tells the client only
"internal error" and the request id.
"""

from __future__ import annotations

from typing import Any

from gateway.boundary import public_error
from services.api import chat_pb2
from services.common import errors


async def abort(context: Any, exc: BaseException, request_id: str) -> None:
    """End the RPC with the error's status (nothing was sent yet)."""
    await errors.abort_with(context, public_error(exc, request_id))


def error_batch(exc: BaseException, request_id: str) -> chat_pb2.ChatEventBatch:
    """The in-band ``error`` event of a stream that already sent frames."""
    return chat_pb2.ChatEventBatch(events=[chat_pb2.ChatEvent(error=errors.to_proto(public_error(exc, request_id)))])


def redact(batch: chat_pb2.ChatEventBatch, request_id: str) -> chat_pb2.ChatEventBatch:
    """``batch`` with any internal ``error`` event the parse service sent replaced by its public form."""
    for event in batch.events:
        if event.WhichOneof("event") == "error":
            event.error.CopyFrom(errors.to_proto(public_error(errors.from_proto(event.error), request_id)))
    return batch
