"""``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health`` and ``GET /ready``."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.apis.anthropic.models_list import model_object, model_page
from gateway.catalog import ModelCatalog
from gateway.model_aliases import ModelAliases
from gateway.parse_client import ParseClient
from gateway.template_notes import template_card
from services.api import chat_pb2
from services.common import errors


def model_card(name: str, info: chat_pb2.ModelInfo, catalog: ModelCatalog | None = None,
               aliases: ModelAliases | None = None) -> dict[str, Any]:
    """OpenAI's model object, plus vLLM's ``max_model_len``, the catalog's metadata and ``aliases``: the other
    names (``pattern``: a glob pattern) this model answers to, in the order they are tried."""
    return {
        "id": name,
        "object": "model",
        "created": info.created,
        "owned_by": "harnessmesh",
        "root": info.served_model_name,
        "max_model_len": info.max_model_len,
        **(catalog or ModelCatalog()).profile(info, name).metadata(),
        "aliases": [{"name": alias.name, "pattern": alias.pattern} for alias in aliases or ()],
        "chat_template": template_card(info),  # what the parse service's template does with the conversation
    }


class ModelsApi:
    """Model discovery and health endpoints over a ``ParseClient``."""

    def __init__(self, parse: ParseClient, catalog: ModelCatalog | None = None) -> None:
        self._parse = parse
        self._catalog = catalog or ModelCatalog()

    async def list_models(self, request: Request) -> Response:
        info = await self._parse.get_model()
        aliases = self._parse.aliases
        if "anthropic-version" in request.headers:  # Anthropic's SDKs and Claude Code send it (patterns listed as is)
            return JSONResponse(model_page([self._parse.public_name(info), *aliases.names()], info))
        card = model_card(self._parse.public_name(info), info, self._catalog, aliases)
        return JSONResponse({"object": "list", "data": [card]})

    async def get_model(self, request: Request) -> Response:
        model_id = request.path_params["model_id"]
        if not model_id:
            raise errors.NotFoundError("model id is empty", param="model")
        public, info = await self._parse.resolve_model(model_id)
        if "anthropic-version" in request.headers:
            return JSONResponse(model_object(public, info))
        return JSONResponse(model_card(public, info, self._catalog, self._parse.aliases))

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(self, request: Request) -> Response:
        try:
            info = await self._parse.get_model(fresh=True)
            ready = await self._parse.ready()
        except errors.MeshError as exc:
            raise errors.UnavailableError(f"the parse service is not ready: {exc.message}") from exc
        if not ready.ready:
            raise errors.UnavailableError(f"not ready: {ready.reason}")
        return JSONResponse({"status": "ready", "model": self._parse.public_name(info), "workers": ready.workers})
