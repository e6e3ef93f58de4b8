"""Composition root of the router process.

On start the router subscribes to its namespace and asks every worker to heartbeat; each worker that
answers is dumped over gRPC (``KvRecovery.Dump``) so a restarted router routes as well as before
within a heartbeat round-trip. With ``--registry-store jetstream`` it also reads the workers' records
from the registry bucket and joins (verified) and dumps them before its server starts, so its first
request already sees the whole fleet and its caches. Any number of routers can run side by side, each
with its own index.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import grpc
import structlog
from nats.aio.client import Client as NatsClient
from opentelemetry import trace

from services.api import router_pb2_grpc, worker_pb2
from services.common import mux, prompt_reuse
from services.common.grpc_util import GrpcServer, check_health
from services.common.metrics import MetricsServer, serve_metrics
from services.common.nats_util import close_nats, connect_nats
from services.common.tracing import Tracing
from services.common.worker_registry import read_records, registry_bucket
from services.router.admission import AdmissionQueue
from services.router.footprint import SessionFootprints
from services.router.index import KvIndex
from services.router.metrics import RouterMetrics
from services.router.nats_consumer import WorkerEventsConsumer
from services.router.pending import PendingPrefixes
from services.router.policy import PlacementPolicy
from services.router.proxy import Proxy, ProxyLimits
from services.router.recovery import KvRecoverer
from services.router.registry import WorkerEndpoint, WorkerRegistry
from services.router.router import Router, Saturation
from services.router.service import RouterServicer
from services.router.settings import RouterSettings
from services.router.worker_client import GrpcRecoverySource, WorkerChannels

log = structlog.get_logger()

FLEET_WAIT = 5.0  # most seconds a starting router spends reading, verifying and dumping the registry's workers


@dataclass
class RunningRouter:
    """A started router (in-process use: tests, benchmarks); :meth:`stop` shuts it down."""

    address: str
    router: Router
    recoverer: KvRecoverer
    admission: AdmissionQueue
    server: GrpcServer
    consumer: WorkerEventsConsumer
    channels: WorkerChannels
    nc: NatsClient
    tracing: Tracing | None
    metrics_server: MetricsServer | None = None

    async def stop(self) -> None:
        if self.metrics_server is not None:
            self.metrics_server.stop()
        await self.server.stop(1.0)
        await self.consumer.stop()
        await self.channels.close_all()
        await close_nats(self.nc)
        log.info("router.stopped")


async def start_router(settings: RouterSettings, tracing: Tracing | None = None) -> RunningRouter:
    registry = WorkerRegistry(settings.worker_timeout)
    index = KvIndex()
    router = Router(
        index, registry,
        PlacementPolicy(settings.router_mode, settings.overlap_weight, temperature=settings.router_temperature),
        Saturation(settings.queue_max_requests, settings.queue_threshold),
        pending=PendingPrefixes(settings.pending_prefix_ttl) if settings.pending_prefix_ttl > 0 else None,
        footprints=SessionFootprints(settings.footprint_window) if settings.footprint_window > 0 else None,
    )
    channels = WorkerChannels(tracing, settings.tls())
    recoverer = KvRecoverer(index, registry, GrpcRecoverySource(channels))
    admission = AdmissionQueue(router.all_saturated)
    limits = ProxyLimits(settings.max_retries, settings.migration_limit, settings.stall_timeout,
                         settings.first_frame_timeout)
    tracer = tracing.tracer if tracing is not None else trace.get_tracer("harnessmesh.router")
    metrics = RouterMetrics()
    metrics.watch(registry, lambda: len(admission), router.pending)
    metrics.watch_index(index)
    proxy = Proxy(router, limits, admission=admission, tracer=tracer, metrics=metrics)
    servicer = RouterServicer(proxy, channels, registry)
    prompt_reuse.watch(metrics.registry, servicer.prompts)
    nc = await connect_nats(settings.nats_url, "harnessmesh-router", token=settings.nats_token, tls=settings.tls())

    async def on_gone(endpoint: WorkerEndpoint, expired: bool) -> None:
        if expired:
            proxy.worker_gone(endpoint.worker_id)
        admission.pump()

    async def probe(endpoint: WorkerEndpoint) -> bool:  # liveness without NATS: the worker's own health
        return await check_health(channels.channel(endpoint.address), deadline=1.0)

    async def verify(endpoint: WorkerEndpoint) -> bool:  # the worker at that address is the one announced
        try:
            info = await channels.stub(endpoint.address).Info(worker_pb2.WorkerInfoRequest(), timeout=1.0)
        except grpc.aio.AioRpcError:
            return False
        return bool(info.worker_id == endpoint.worker_id)

    consumer = WorkerEventsConsumer(nc, settings.namespace, router, recoverer, on_gone, probe=probe,
                                    verify=verify)
    server = GrpcServer(tracing, settings.host, settings.port, settings.tls())
    router_pb2_grpc.add_RouterServicer_to_server(servicer, server.server)
    server.add_mux({mux.method_name("Router", "Generate"):
                    mux.MuxMethod(servicer.Generate, worker_pb2.GenerateRequest)}, linger=settings.stream_linger())
    await consumer.start()
    if settings.registry_store == "jetstream":
        await read_fleet(nc, settings, consumer, recoverer)
    await server.start()
    log.info("router.ready", address=server.address, mode=settings.router_mode)
    return RunningRouter(server.address, router, recoverer, admission, server, consumer, channels, nc, tracing,
                         serve_metrics(metrics.registry, settings.host, settings.metrics_port))


async def read_fleet(nc: NatsClient, settings: RouterSettings, consumer: WorkerEventsConsumer,
                     recoverer: KvRecoverer) -> None:
    """Join every worker of the registry bucket (verified over gRPC) and dump its KV blocks before serving;
    at most ``FLEET_WAIT`` s in all. NATS or JetStream unavailable: the heartbeats alone, as without it."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    bucket = registry_bucket(settings.registry_bucket, settings.namespace)
    try:
        records = await asyncio.wait_for(read_records(nc.jetstream(), bucket, timeout=FLEET_WAIT), FLEET_WAIT)
    except Exception as exc:  # TimeoutError included: a JetStream cluster without a leader
        log.warning("router.registry_unavailable", bucket=bucket, error=repr(exc),
                    reason="the fleet is learnt from heartbeats only")
        return
    joined = await consumer.seed(records, timeout=FLEET_WAIT)
    with contextlib.suppress(asyncio.TimeoutError):  # placement by load until a late dump arrives
        await asyncio.wait_for(recoverer.wait_idle(), max(FLEET_WAIT - (loop.time() - started), 0.1))
    log.info("router.registry_read", bucket=bucket, records=len(records), joined=joined,
             ms=round((loop.time() - started) * 1000, 1))


async def serve(settings: RouterSettings, stop: asyncio.Event) -> None:
    tracing = Tracing("harnessmesh-router")
    try:
        running = await start_router(settings, tracing)
        try:
            await stop.wait()
        finally:
            await running.stop()
    finally:
        tracing.shutdown()
