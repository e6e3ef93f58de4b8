"""The Responses API's routes over one ``ResponsesApi``, and the store the gateway's settings choose.

``gateway.app.create_app`` routes ``POST /v1/responses`` to an API over an in-memory store; the
composition root (``gateway/server.py``) calls :func:`serve_responses_from` once, before it serves, with
the store :func:`open_response_store` built (memory or JetStream), which also adds ``GET`` and ``DELETE
/v1/responses/{response_id}``. The routes stay inside the app's middleware (API key, body limit, spans).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.routing import BaseRoute, Route

from gateway.apis.responses.endpoint import ResponsesApi
from gateway.apis.responses.jetstream_store import JetStreamResponseStore
from gateway.apis.responses.store import ResponseStorage, ResponseStore
from gateway.settings import GatewaySettings
from services.common.jetstream import BucketConfig, ChunkedKv, bucket_name, chunk_size_for, open_bucket
from services.common.nats_util import close_nats, connect_nats

PATH = "/v1/responses"


def responses_routes(api: ResponsesApi) -> list[BaseRoute]:
    """``POST /v1/responses`` and ``GET`` / ``DELETE /v1/responses/{response_id}``."""
    return [
        Route(PATH, api.create, methods=["POST"]),
        Route(PATH + "/{response_id}", api.retrieve, methods=["GET"]),
        Route(PATH + "/{response_id}", api.delete, methods=["DELETE"]),
    ]


def serve_responses_from(app: Starlette, api: ResponsesApi) -> None:
    """Route the Responses API of ``app`` to ``api`` (replacing the routes ``create_app`` made)."""
    routes = app.router.routes
    kept = [r for r in routes if not getattr(r, "path", "").startswith(PATH)]
    routes[:] = [*responses_routes(api), *kept]


@dataclass
class OpenedStore:
    """The store the settings chose and the NATS connection it holds (None in memory)."""

    store: ResponseStorage
    nats: Any = None

    async def close(self) -> None:
        if self.nats is not None:
            await close_nats(self.nats)


async def open_response_store(settings: GatewaySettings) -> OpenedStore:
    """The Responses store ``settings.responses_store`` names; jetstream connects to NATS and opens the bucket."""
    if settings.responses_store == "memory":
        return OpenedStore(ResponseStore(settings.responses_store_size, settings.responses_store_ttl))
    nc = await connect_nats(settings.nats_url, "harnessmesh-gateway", token=settings.nats_token, tls=settings.tls())
    try:
        bucket = bucket_name(settings.responses_store_bucket, settings.namespace, "responses")
        kv = await open_bucket(nc.jetstream(), BucketConfig(
            bucket, settings.responses_store_ttl, settings.responses_store_max_bytes,
            replicas=settings.responses_store_replicas))
        store = JetStreamResponseStore(ChunkedKv(kv, chunk_size=chunk_size_for(nc)), bucket=bucket,
                                       ttl=settings.responses_store_ttl,
                                       max_bytes=settings.responses_store_max_bytes)
    except BaseException:
        await close_nats(nc)
        raise
    return OpenedStore(store, nc)
