"""The Responses API's errors: OpenAI's shape over HTTP (the chat API's table, re-exported), and the
``error`` object a ``response.failed`` event carries after the first byte."""

from __future__ import annotations

from typing import Any

from gateway.apis.openai_chat.errors import error_body, error_response, from_validation_error
from services.common import errors

__all__ = ["error_body", "error_response", "failed_error", "from_validation_error"]


def failed_error(error: errors.MeshError) -> dict[str, Any]:
    """``response.error``: OpenAI's error object, ``code`` falling back to the type."""
    body = error_body(error)["error"]
    return {"code": body["code"] or body["type"], "message": body["message"], "type": body["type"],
            "param": body["param"]}
