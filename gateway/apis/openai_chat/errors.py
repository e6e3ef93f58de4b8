"""The one mapping of mesh errors to OpenAI's error shape (chat completions, Responses, tokenize, models).

``{"error": {"message", "type", "param", "code"}}`` with the status of the error's category.
Before the first byte of a response the error is an HTTP status; after it, the same body is an
in-band SSE event followed by ``data: [DONE]``. Errors reach here through ``gateway.boundary.public_error``.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from starlette.responses import JSONResponse

from gateway.boundary import retry_after_header
from services.common import errors

# (type, code) per error class; the most specific class wins (ContextLengthError before InvalidRequest).
_SHAPES: tuple[tuple[type[errors.MeshError], str, str | None], ...] = (
    (errors.ContextLengthError, "invalid_request_error", "context_length_exceeded"),
    (errors.RequestTooLargeError, "invalid_request_error", "request_too_large"),
    (errors.InvalidRequestError, "invalid_request_error", None),
    (errors.NotFoundError, "not_found_error", "model_not_found"),
    (errors.OverloadedError, "rate_limit_error", "overloaded"),
    (errors.UnavailableError, "service_unavailable", "service_unavailable"),
    (errors.UnauthenticatedError, "authentication_error", "invalid_api_key"),
    (errors.RequestCancelledError, "cancelled", "cancelled"),
    (errors.InternalError, "server_error", None),
)


def error_body(error: errors.MeshError) -> dict[str, Any]:
    """OpenAI's error object for ``error``."""
    kind, code = "server_error", None
    for cls, shape_type, shape_code in _SHAPES:
        if isinstance(error, cls):
            kind, code = shape_type, shape_code
            break
    return {"error": {"message": error.message, "type": kind, "param": error.param or None, "code": code}}


def error_response(error: errors.MeshError) -> JSONResponse:
    """An OpenAI-shaped JSON error response with the category's status."""
    return JSONResponse(error_body(error), status_code=error.http_status, headers=retry_after_header(error))


def _loc_to_param(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


def from_validation_error(exc: ValidationError) -> errors.InvalidRequestError:
    """A pydantic validation error as a 400 naming the first offending field."""
    # Union members add their type name to the location (``content.str``, ``tool_choice.NamedToolChoice``);
    # drop those segments, and report the deepest error: the union member the client most likely meant.
    def clean(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
        return tuple(p for p in loc if not (isinstance(p, str) and _is_type_tag(p)))

    first = max(exc.errors(), key=lambda e: len(clean(e["loc"])))
    param = _loc_to_param(clean(first["loc"]))
    message = f"{param}: {first['msg']}" if param else str(first["msg"])
    return errors.InvalidRequestError(message, param=param)


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _is_type_tag(segment: str) -> bool:
    # Request fields are snake_case; type tags are builtins, generics (``list[...]``) or model names.
    return "[" in segment or segment in _TYPE_TAGS or segment[:1].isupper()
