"""Composition root of the worker: model dir, engine, NATS publisher, gRPC server.

In-process use (tests, other services' tests)::

    worker = await start_worker(WorkerSettings(nats_url=url, speedup=1000))
    ...  # dial worker.address; worker.engine is the engine
    await worker.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
from dataclasses import dataclass

import structlog
from nats.aio.client import Client as NatsClient

from services.api import kv_pb2_grpc, worker_pb2, worker_pb2_grpc
from services.common import mux, prompt_reuse
from services.common.grpc_util import GrpcServer
from services.common.jetstream import BucketConfig
from services.common.metrics import MetricsServer, serve_metrics
from services.common.model_dir import load_model_dir
from services.common.nats_util import close_nats, connect_nats
from services.common.tracing import Tracing
from services.common.worker_registry import TTL_HEARTBEATS, RegistryWriter, registry_bucket
from services.worker import convert
from services.worker.engine import Engine
from services.worker.kv_publisher import KvPublisher
from services.worker.kv_recovery import KvRecoveryServicer
from services.worker.metrics import WorkerMetrics
from services.worker.registry import build_engine
from services.worker.service import WorkerServicer
from services.worker.settings import WorkerSettings

log = structlog.get_logger()


@dataclass
class RunningWorker:
    """A started worker: its id, address, engine and publisher; :meth:`stop` shuts it down cleanly."""

    worker_id: str
    address: str
    engine: Engine
    publisher: KvPublisher
    grpc: GrpcServer
    nc: NatsClient
    tracing: Tracing | None
    metrics_server: MetricsServer | None = None

    def info(self) -> worker_pb2.WorkerInfo:
        return convert.worker_info_to_proto(self.engine.info(), self.worker_id, self.address)

    async def stop(self, grace: float = 2.0) -> None:
        """Leaving heartbeat, stop serving (in-flight streams get ``grace`` s), engine close, NATS drain."""
        with contextlib.suppress(Exception):
            await self.publisher.leave()
        await self.grpc.stop(grace)
        if self.metrics_server is not None:
            self.metrics_server.stop()
        await self.engine.close()
        with contextlib.suppress(Exception):
            await self.publisher.close()
        await close_nats(self.nc)
        log.info("worker.stopped", worker_id=self.worker_id)


def registry_writer(settings: WorkerSettings, nc: NatsClient, worker_id: str) -> RegistryWriter | None:
    """The writer of this worker's registry record (``--registry-store jetstream``), else None."""
    if settings.registry_store != "jetstream":
        return None
    config = BucketConfig(registry_bucket(settings.registry_bucket, settings.namespace),
                          ttl=TTL_HEARTBEATS * settings.heartbeat_interval, memory=True,
                          replicas=settings.registry_replicas)
    return RegistryWriter(nc.jetstream(), config, worker_id)


async def start_worker(settings: WorkerSettings, tracing: Tracing | None = None) -> RunningWorker:
    """Build and start every part of a worker; raise (with everything closed) if one fails."""
    worker_id = settings.worker_id or f"worker-{secrets.token_hex(4)}"
    model = load_model_dir(settings.model)
    if settings.max_model_len:  # one option for the whole mesh: the parse service fits prompts to it too
        model = dataclasses.replace(model, max_model_len=settings.max_model_len)
    engine = build_engine(settings, model)
    server = GrpcServer(tracing, settings.host, settings.port, settings.tls())
    address = f"{settings.advertise_host or server.host}:{server.port}"

    def info() -> worker_pb2.WorkerInfo:
        return convert.worker_info_to_proto(engine.info(), worker_id, address)

    tracer = tracing.tracer if tracing is not None else None
    metrics = WorkerMetrics()
    metrics.watch(engine, worker_id)
    servicer = WorkerServicer(engine, worker_id, info, tracer, metrics)
    prompt_reuse.watch(metrics.registry, servicer.prompts)
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server.server)
    server.add_mux({mux.method_name("Worker", "Generate"):
                    mux.MuxMethod(servicer.Generate, worker_pb2.GenerateRequest)}, linger=settings.stream_linger())
    nc = await connect_nats(settings.nats_url, worker_id, token=settings.nats_token, tls=settings.tls())
    try:
        await engine.start()
        publisher = KvPublisher(nc, engine, info, namespace=settings.namespace,
                                interval=settings.heartbeat_interval, buffer_size=settings.event_buffer,
                                linger=settings.kv_events_linger_ms / 1000,
                                registry=registry_writer(settings, nc, worker_id))
        kv_pb2_grpc.add_KvRecoveryServicer_to_server(KvRecoveryServicer(worker_id, publisher), server.server)
        await server.start()
        await publisher.start()
    except BaseException:
        await engine.close()
        await server.stop(0)
        await nc.close()
        raise
    engine_info = engine.info()  # the engine's real block size and capacity, not the options asked for
    log.info("worker.ready", worker_id=worker_id, address=address, engine=settings.engine, model=model.name,
             block_size=engine_info.block_size, total_blocks=engine_info.total_blocks)
    return RunningWorker(worker_id, address, engine, publisher, server, nc, tracing,
                         serve_metrics(metrics.registry, settings.host, settings.metrics_port))


async def serve(settings: WorkerSettings, stop: asyncio.Event) -> None:
    """Run a worker until ``stop`` is set."""
    tracing = Tracing("harnessmesh-worker")
    try:
        worker = await start_worker(settings, tracing)
        try:
            await stop.wait()
        finally:
            await worker.stop(settings.drain_grace)
    finally:
        tracing.shutdown()
