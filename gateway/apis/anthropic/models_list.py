"""Anthropic's shape of ``GET /v1/models`` and ``GET /v1/models/{id}`` (requests with ``anthropic-version``)."""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Any

from services.api import chat_pb2


def model_object(name: str, info: chat_pb2.ModelInfo) -> dict[str, Any]:
    """One model: ``type``, ``id``, ``display_name``, ``created_at`` (RFC 3339), context and output limits."""
    created = datetime.datetime.fromtimestamp(info.created, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": "model",
        "id": name,
        "display_name": name,
        "created_at": created,
        "max_input_tokens": info.max_model_len,
        "max_tokens": info.max_model_len,
    }


def model_page(names: Iterable[str], info: chat_pb2.ModelInfo) -> dict[str, Any]:
    """The list response: ``data``, ``has_more``, ``first_id``, ``last_id`` (one page holds every model)."""
    data = [model_object(name, info) for name in dict.fromkeys(names)]
    return {"data": data, "has_more": False, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}
