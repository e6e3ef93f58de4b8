"""Composition root of the router process."""

from __future__ import annotations

import asyncio

import nats
import structlog

from services.api import router_pb2_grpc
from services.common.grpc_util import GrpcServer
from services.common.tracing import Tracing
from services.router.events import WorkerEventsConsumer
from services.router.index import KvIndex
from services.router.policy import PlacementPolicy
from services.router.registry import WorkerEndpoint, WorkerRegistry
from services.router.router import Router
from services.router.service import RouterServicer, WorkerChannels
from services.router.settings import RouterSettings

log = structlog.get_logger()


async def serve(settings: RouterSettings, stop: asyncio.Event) -> None:
    tracing = Tracing("harnessmesh-router")
    router = Router(
        KvIndex(),
        WorkerRegistry(settings.worker_timeout),
        PlacementPolicy(settings.router_mode, settings.overlap_weight),
    )
    channels = WorkerChannels(tracing)
    nc = await nats.connect(settings.nats_url, name="harnessmesh-router", max_reconnect_attempts=-1)

    async def on_gone(endpoint: WorkerEndpoint) -> None:
        await channels.close(endpoint.address)

    consumer = WorkerEventsConsumer(nc, settings.namespace, router, on_gone)
    server = GrpcServer(tracing, settings.host, settings.port)
    router_pb2_grpc.add_RouterServicer_to_server(
        RouterServicer(router, channels, settings.max_retries, tracing.tracer), server.server
    )
    await consumer.start()
    await server.start()
    log.info("router.ready", address=server.address, mode=settings.router_mode)
    try:
        await stop.wait()
    finally:
        await server.stop()
        await consumer.stop()
        await channels.close_all()
        await nc.drain()
        tracing.shutdown()
        log.info("router.stopped")
