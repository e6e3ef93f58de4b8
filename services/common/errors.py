"""The mesh's one exception tree, and its single mapping to gRPC status and in-band errors.

Every process raises these; the gRPC boundary (:func:`to_grpc_status`, :func:`from_rpc_error`) and
the proto boundary (:func:`to_proto`, :func:`from_proto`) convert them both ways so an error keeps
its category across hops. The gateway maps the same categories to each HTTP API's error shape.
"""

from __future__ import annotations

import contextlib
import math
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # grpc and the generated protobuf module load on first use: the offline replay needs neither
    import grpc

    from services.api import common_pb2


class _GrpcStatus:
    """A class's gRPC status, read as ``cls.grpc_status`` or ``error.grpc_status``: ``grpc.StatusCode`` named by
    the class's ``status_name`` (grpc's import is ~50 ms, which a process that never meets gRPC does not pay)."""

    def __get__(self, obj: object, owner: type[MeshError]) -> grpc.StatusCode:
        import grpc

        return grpc.StatusCode[owner.status_name]


class _ProtoCode:
    """A class's ``common.ErrorCode`` value, read as ``cls.code`` or ``error.code``, named by its ``code_name``."""

    def __get__(self, obj: object, owner: type[MeshError]) -> int:
        from services.api import common_pb2

        return int(common_pb2.ErrorCode.Value(owner.code_name))


class MeshError(Exception):
    """Base of every error the mesh reports to a client."""

    code_name = "ERROR_CODE_INTERNAL"
    status_name = "INTERNAL"
    code = _ProtoCode()
    grpc_status = _GrpcStatus()
    http_status: int = 500

    def __init__(self, message: str, *, param: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequestError(MeshError):
    """The request is malformed or asks for something the model cannot do."""

    code_name = "ERROR_CODE_INVALID_REQUEST"
    status_name = "INVALID_ARGUMENT"
    http_status = 400


class ContextLengthError(InvalidRequestError):
    """The prompt (plus max_tokens) does not fit the model's context."""

    code_name = "ERROR_CODE_CONTEXT_LENGTH"
    status_name = "OUT_OF_RANGE"
    http_status = 400


class RequestTooLargeError(InvalidRequestError):
    """The request body is over the edge's size limit (refused before it is read past the limit)."""

    http_status = 413


class NotFoundError(MeshError):
    """An unknown model or resource."""

    code_name = "ERROR_CODE_NOT_FOUND"
    status_name = "NOT_FOUND"
    http_status = 404


class UnavailableError(MeshError):
    """No worker (or downstream service) can take the request now."""

    code_name = "ERROR_CODE_UNAVAILABLE"
    status_name = "UNAVAILABLE"
    http_status = 503


class OverloadedError(UnavailableError):
    """Refused at admission: more requests are running and waiting than the mesh takes; retry later.

    ``retry_after``: seconds the client should wait (each API sends it as ``retry-after``).
    """

    status_name = "RESOURCE_EXHAUSTED"
    http_status = 429

    def __init__(self, message: str, *, param: str = "", retry_after: float = 1.0) -> None:
        super().__init__(message, param=param)
        self.retry_after = retry_after


class UnauthenticatedError(MeshError):
    """Missing or wrong API key."""

    code_name = "ERROR_CODE_UNAUTHENTICATED"
    status_name = "UNAUTHENTICATED"
    http_status = 401


class RequestCancelledError(MeshError):
    """The client went away."""

    code_name = "ERROR_CODE_CANCELLED"
    status_name = "CANCELLED"
    http_status = 499


class InternalError(MeshError):
    """A bug or an unexpected failure inside the mesh."""


class PromptBaseUnknownError(MeshError):
    """A hop was sent the tail of a prompt whose prefix it no longer holds (``services.common.prompt_reuse``).

    Only between hops: the sender answers it by sending the whole prompt, no client sees it.
    """

    status_name = "FAILED_PRECONDITION"


_MAPPED = (
    InvalidRequestError,
    ContextLengthError,
    NotFoundError,
    UnavailableError,
    UnauthenticatedError,
    RequestCancelledError,
    InternalError,
)


@cache
def _by_code() -> dict[int, type[MeshError]]:
    return {cls.code: cls for cls in _MAPPED}


@cache
def _by_status() -> dict[grpc.StatusCode, type[MeshError]]:
    import grpc

    by_status: dict[grpc.StatusCode, type[MeshError]] = {cls.grpc_status: cls for cls in _MAPPED}
    by_status[grpc.StatusCode.DEADLINE_EXCEEDED] = UnavailableError
    by_status[grpc.StatusCode.FAILED_PRECONDITION] = PromptBaseUnknownError
    by_status[grpc.StatusCode.RESOURCE_EXHAUSTED] = OverloadedError
    return by_status

# gRPC trailing-metadata key carrying the offending field, so `param` survives a hop.
PARAM_METADATA_KEY = "harnessmesh-error-param"
RETRY_AFTER_METADATA_KEY = "retry-after"  # seconds, on RESOURCE_EXHAUSTED


def to_proto(error: MeshError) -> common_pb2.Error:
    from services.api import common_pb2

    return common_pb2.Error(code=error.code, message=error.message, param=error.param)  # type: ignore[arg-type]


def from_proto(error: common_pb2.Error) -> MeshError:
    cls = _by_code().get(error.code, InternalError)
    return cls(error.message, param=error.param)


def as_mesh_error(exc: BaseException) -> MeshError:
    """Any exception as a MeshError (unknown ones become InternalError, keeping the cause)."""
    if isinstance(exc, MeshError):
        return exc
    import grpc

    if isinstance(exc, grpc.aio.AioRpcError):
        return from_rpc_error(exc)
    err = InternalError(f"{type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err


def from_rpc_error(exc: grpc.aio.AioRpcError) -> MeshError:
    import grpc

    cls = _by_status().get(exc.code(), InternalError)
    param, retry_after = "", 1.0
    for key, value in exc.trailing_metadata() or ():
        text = value if isinstance(value, str) else value.decode()
        if key == PARAM_METADATA_KEY:
            param = text
        elif key == RETRY_AFTER_METADATA_KEY:
            with contextlib.suppress(ValueError):
                retry_after = float(text)
    details = exc.details() or exc.code().name
    if exc.code() == grpc.StatusCode.UNAVAILABLE and cls is UnavailableError and "failed to connect" in details:
        details = "a downstream service is unreachable: " + details
    err = cls(details, param=param)
    if isinstance(err, OverloadedError):
        err.retry_after = retry_after
    err.__cause__ = exc
    return err


async def abort_with(context: Any, error: MeshError) -> None:
    """End an RPC with the error's gRPC status (before any stream frame was sent)."""
    trailing: list[tuple[str, str]] = []
    if error.param:
        trailing.append((PARAM_METADATA_KEY, error.param))
    if isinstance(error, OverloadedError):
        trailing.append((RETRY_AFTER_METADATA_KEY, str(max(1, math.ceil(error.retry_after)))))
    if trailing:
        context.set_trailing_metadata(tuple(trailing))
    await context.abort(error.grpc_status, error.message)
