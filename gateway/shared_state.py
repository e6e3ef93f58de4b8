"""The gateway's state that may outlive one replica, opened once by the composition root (docs/state.md).

``--responses-store`` and ``--turn-links-store`` each choose this process's memory or a NATS JetStream KV
bucket every gateway replica shares; the JetStream ones share one NATS connection, opened here only when
one of them needs it. ``server.py`` hands the stores to ``create_app`` and the ``TurnTracker``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.apis.responses.jetstream_store import JetStreamResponseStore
from gateway.apis.responses.store import ResponseStorage, ResponseStore
from gateway.settings import GatewaySettings
from gateway.turn_links import JetStreamTurnLinks
from services.common.jetstream import BucketConfig, ChunkedKv, bucket_name, chunk_size_for, open_bucket
from services.common.nats_util import close_nats, connect_nats


@dataclass
class GatewayState:
    """The Responses store, the shared turn links (None: in the tracker's memory) and their NATS connection."""

    responses: ResponseStorage
    turn_links: JetStreamTurnLinks | None = None
    nats: Any = None  # None: everything in memory

    async def close(self) -> None:
        if self.nats is not None:
            await close_nats(self.nats)


async def open_state(settings: GatewaySettings) -> GatewayState:
    """The stores ``settings`` choose; NATS is connected, and the buckets opened, only for the jetstream ones."""
    memory = ResponseStore(settings.responses_store_size, settings.responses_store_ttl)
    if settings.responses_store == "memory" and settings.turn_links_store == "memory":
        return GatewayState(memory)
    nc = await connect_nats(settings.nats_url, "harnessmesh-gateway", token=settings.nats_token, tls=settings.tls())
    try:
        js, chunk = nc.jetstream(), chunk_size_for(nc)
        responses: ResponseStorage = memory
        if settings.responses_store == "jetstream":
            bucket = bucket_name(settings.responses_store_bucket, settings.namespace, "responses")
            kv = await open_bucket(js, BucketConfig(bucket, settings.responses_store_ttl,
                                                    settings.responses_store_max_bytes,
                                                    replicas=settings.responses_store_replicas))
            responses = JetStreamResponseStore(ChunkedKv(kv, chunk_size=chunk), bucket=bucket,
                                               ttl=settings.responses_store_ttl,
                                               max_bytes=settings.responses_store_max_bytes)
        links = None
        if settings.turn_links_store == "jetstream":
            kv = await open_bucket(js, BucketConfig(
                bucket_name(settings.turn_links_bucket, settings.namespace, "turn_links"), settings.turn_links_ttl,
                settings.turn_links_max_bytes, replicas=settings.turn_links_replicas))
            links = JetStreamTurnLinks(ChunkedKv(kv, chunk_size=chunk), connected=lambda: bool(nc.is_connected))
    except BaseException:
        await close_nats(nc)
        raise
    return GatewayState(responses, links, nc)
