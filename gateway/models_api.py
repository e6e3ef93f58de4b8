"""``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health`` and ``GET /ready``."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.parse_client import ParseClient
from services.api import chat_pb2
from services.common import errors


def model_card(name: str, info: chat_pb2.ModelInfo) -> dict[str, Any]:
    """OpenAI's model object, plus vLLM's ``max_model_len``."""
    return {
        "id": name,
        "object": "model",
        "created": info.created,
        "owned_by": "harnessmesh",
        "root": info.served_model_name,
        "max_model_len": info.max_model_len,
    }


class ModelsApi:
    """Model discovery and health endpoints over a ``ParseClient``."""

    def __init__(self, parse: ParseClient) -> None:
        self._parse = parse

    async def list_models(self, request: Request) -> Response:
        info = await self._parse.get_model()
        return JSONResponse({"object": "list", "data": [model_card(self._parse.public_name(info), info)]})

    async def get_model(self, request: Request) -> Response:
        model_id = request.path_params["model_id"]
        if not model_id:
            raise errors.NotFoundError("model id is empty", param="model")
        public, info = await self._parse.resolve_model(model_id)
        return JSONResponse(model_card(public, info))

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(self, request: Request) -> Response:
        try:
            info = await self._parse.get_model(fresh=True)
        except errors.MeshError as exc:
            raise errors.UnavailableError(f"the parse service is not ready: {exc.message}") from exc
        return JSONResponse({"status": "ready", "model": self._parse.public_name(info)})
