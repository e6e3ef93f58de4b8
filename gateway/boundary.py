"""What a client is told about a failure, and the request id it is told with.

Every place where an error becomes a client reply — the HTTP app's exception handlers, an in-band
error after the first byte of a stream, the gRPC edge — passes it through :func:`public_error`,
then into its API's own shape (``apis/<api>/errors.py``). An internal error (a bug or an
unexpected failure here or in a service behind us, whose message may carry an exception's type and
text) tells the client only ``internal error`` and the request id; the real error is logged once,
with the same id, as ``gateway.internal_error``.

HTTP handlers bind the id they give the turn (``chatcmpl-…``, ``msg_…``, ``resp_…``) to the request
with :func:`new_request_id`, so the boundary names the id the mesh's logs carry.
"""

from __future__ import annotations

import math
import uuid

import structlog
from starlette.requests import HTTPConnection

from services.api import common_pb2
from services.common import errors

log = structlog.get_logger()

_STATE_KEY = "harnessmesh_request_id"


def new_request_id(conn: HTTPConnection, prefix: str) -> str:
    """A fresh request id (``prefix`` + 32 hex digits), bound to ``conn`` for the error boundary."""
    request_id = prefix + uuid.uuid4().hex
    conn.scope.setdefault("state", {})[_STATE_KEY] = request_id
    return request_id


def request_id_of(conn: HTTPConnection) -> str:
    """The id bound to ``conn``, else a fresh ``req_…`` one (bound from now on)."""
    bound = conn.scope.get("state", {}).get(_STATE_KEY)
    return bound if isinstance(bound, str) else new_request_id(conn, "req_")


def public_error(exc: BaseException, request_id: str) -> errors.MeshError:
    """``exc`` as the client may see it: a ``MeshError`` as it is, unless it is internal."""
    mesh = errors.as_mesh_error(exc)
    if mesh.code != common_pb2.ERROR_CODE_INTERNAL:  # InternalError, or a bare MeshError
        return mesh
    log.error("gateway.internal_error", request_id=request_id, error=mesh.message,
              exc_info=exc if exc.__traceback__ is not None else None)
    public = errors.InternalError(f"internal error (request id: {request_id})")
    public.__cause__ = mesh
    return public


def retry_after_header(error: errors.MeshError) -> dict[str, str]:
    """``retry-after`` (whole seconds) for an overload refusal, in every API's shape; nothing otherwise."""
    if isinstance(error, errors.OverloadedError):
        return {"retry-after": str(max(1, math.ceil(error.retry_after)))}
    return {}
