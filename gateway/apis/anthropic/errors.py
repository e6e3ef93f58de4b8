"""The one mapping of mesh errors to Anthropic's error shape, as a JSON response or an in-band ``error`` event.

``{"type": "error", "error": {"type": ..., "message": ...}, "request_id": ...}``. Statuses follow
Anthropic's: 400 invalid_request_error, 401 authentication_error, 404 not_found_error,
529 overloaded_error (no worker: clients such as Claude Code retry it), 500 api_error. A prompt that
does not fit says "prompt is too long", the phrase Claude Code reacts to by compacting.
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import ValidationError
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse

from gateway.boundary import retry_after_header
from services.common import errors

# (error class, Anthropic type, HTTP status); the most specific class first.
_SHAPES: tuple[tuple[type[errors.MeshError], str, int], ...] = (
    (errors.ContextLengthError, "invalid_request_error", 400),
    (errors.RequestTooLargeError, "request_too_large", 413),
    (errors.InvalidRequestError, "invalid_request_error", 400),
    (errors.NotFoundError, "not_found_error", 404),
    (errors.UnavailableError, "overloaded_error", 529),
    (errors.UnauthenticatedError, "authentication_error", 401),
    (errors.RequestCancelledError, "api_error", 499),
    (errors.InternalError, "api_error", 500),
)

ANTHROPIC_PATH_PREFIX = "/v1/messages"


def is_anthropic_request(conn: HTTPConnection) -> bool:
    """Requests answered in Anthropic's shape: the Messages API, and anything sent with ``anthropic-version``."""
    return conn.url.path.startswith(ANTHROPIC_PATH_PREFIX) or "anthropic-version" in conn.headers


def _shape(error: errors.MeshError) -> tuple[str, int]:
    for cls, kind, status in _SHAPES:
        if isinstance(error, cls):
            return kind, status
    return "api_error", 500


def error_body(error: errors.MeshError, request_id: str = "") -> dict[str, Any]:
    """Anthropic's error object for ``error`` (``request_id``: the request's, else a fresh ``req_…``)."""
    kind, _ = _shape(error)
    message = error.message
    if isinstance(error, errors.ContextLengthError) and "prompt is too long" not in message:
        message = f"prompt is too long: {message}"
    return {"type": "error", "error": {"type": kind, "message": message},
            "request_id": request_id or "req_" + uuid.uuid4().hex}


def error_response(error: errors.MeshError, request_id: str = "") -> JSONResponse:
    """An Anthropic-shaped JSON error response with the category's status."""
    _, status = _shape(error)
    return JSONResponse(error_body(error, request_id), status_code=status, headers=retry_after_header(error))


# ``unknown``: the tag of a content block whose type this gateway does not know (``models.UnknownBlock``);
# the block's own tags (``tool_result``) stay, as in Anthropic's paths.
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "unknown"}


def _keep(segment: int | str) -> bool:
    # pydantic adds union member names to locations: builtins, generics (``list[...]``) and model names.
    if isinstance(segment, int):
        return True
    return not ("[" in segment or segment in _TYPE_TAGS or segment[:1].isupper())


def from_validation_error(exc: ValidationError) -> errors.InvalidRequestError:
    """A 400 naming the field like Anthropic does (``messages.1.content.0.tool_result.tool_use_id: ...``)."""
    def path(loc: tuple[int | str, ...]) -> str:
        return ".".join(str(p) for p in loc if _keep(p))

    first = max(exc.errors(), key=lambda e: len([p for p in e["loc"] if _keep(p)]))
    param = path(first["loc"])
    message = f"{param}: {first['msg']}" if param else str(first["msg"])
    return errors.InvalidRequestError(message, param=param)
