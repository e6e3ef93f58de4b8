"""The worker registry in a JetStream KV bucket (``--registry-store jetstream``) against a real nats-server:
a router started after the workers knows them before it serves, a stale record expires, a forged one is
never routed to."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest

from services.api import kv_pb2, worker_pb2
from services.common.jetstream import BucketConfig
from services.common.worker_registry import RegistryWriter, read_records, registry_bucket
from services.launcher.supervisor import free_port
from services.worker.server import RunningWorker
from tests.router.conftest import Mesh, generate, request, wait_until

pytestmark = pytest.mark.timeout(60)

JETSTREAM = {"registry_store": "jetstream"}


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Any]:
    conn = await nats.connect(nats_url)
    yield conn
    await conn.close()


async def silence_heartbeats(worker: RunningWorker) -> None:
    """The worker answers no discover request (its periodic heartbeats are far apart in these tests): a router
    can learn of it only from the bucket."""
    sub = worker.publisher._discover_sub
    await sub.unsubscribe()
    worker.publisher._discover_sub = None


def forged(worker_id: str, address: str) -> bytes:
    info = worker_pb2.WorkerInfo(worker_id=worker_id, grpc_address=address, block_size=16, total_blocks=512)
    return kv_pb2.WorkerHeartbeat(info=info).SerializeToString()


async def test_a_router_started_after_the_workers_routes_at_once_from_the_bucket(mesh: Mesh) -> None:
    workers = [await mesh.worker(heartbeat_interval=30.0, **JETSTREAM) for _ in range(2)]
    for w in workers:
        await silence_heartbeats(w)
    prompt = list(range(64))
    tokens, _, first = await generate(mesh.stub(await mesh.router(**JETSTREAM)), request(prompt))
    assert len(tokens) == 2

    router = await mesh.router(**JETSTREAM)  # no heartbeat for 30 s, no discover answer: only the bucket
    assert {ep.worker_id for ep in router.router.registry.endpoints()} == {w.worker_id for w in workers}
    assert router.router.index.block_count(first) >= 4  # dumped before it served
    _, final, worker = await generate(mesh.stub(router), request(prompt))  # its first request, at once
    assert worker == first and final.usage.cached_tokens >= 48  # placed by the dumped cache

    blind = await mesh.router(registry_store="heartbeats")  # knows nobody until the next heartbeat
    assert len(blind.router.registry) == 0


async def test_a_stale_record_expires_and_a_leaving_worker_deletes_its_own(mesh: Mesh, nc: Any) -> None:
    bucket = registry_bucket("", mesh.namespace)
    worker = await mesh.worker(heartbeat_interval=0.2, **JETSTREAM)  # records live 0.6 s
    records = [kv_pb2.WorkerHeartbeat.FromString(r) for r in await read_records(nc.jetstream(), bucket)]
    assert [r.info.worker_id for r in records] == [worker.worker_id]
    assert records[0].info.grpc_address == worker.address and records[0].info.block_size == 16

    # a worker that died without leaving: its record is no longer refreshed
    dead = RegistryWriter(nc.jetstream(), BucketConfig(bucket, ttl=0.6, memory=True), "dead-worker")
    await dead.put(forged("dead-worker", f"127.0.0.1:{free_port()}"))
    ids = {kv_pb2.WorkerHeartbeat.FromString(r).info.worker_id for r in await read_records(nc.jetstream(), bucket)}
    assert ids == {worker.worker_id, "dead-worker"}
    await asyncio.sleep(1.0)
    ids = {kv_pb2.WorkerHeartbeat.FromString(r).info.worker_id for r in await read_records(nc.jetstream(), bucket)}
    assert ids == {worker.worker_id}  # the live worker refreshed its record with each heartbeat
    assert worker.publisher._registry is not None and worker.publisher._registry.writes >= 3

    await worker.stop(0)
    mesh.workers.remove(worker)
    assert await read_records(nc.jetstream(), bucket) == []  # deleted when it left, not left to expire


async def test_a_forged_record_never_receives_a_prompt(mesh: Mesh, nc: Any) -> None:
    worker = await mesh.worker(heartbeat_interval=30.0, **JETSTREAM)
    await silence_heartbeats(worker)
    bucket = registry_bucket("", mesh.namespace)
    config = BucketConfig(bucket, ttl=90.0, memory=True)
    # a record claiming a real worker's address under another id, and one pointing at a port nobody serves
    await RegistryWriter(nc.jetstream(), config, "impostor").put(forged("impostor", worker.address))
    await RegistryWriter(nc.jetstream(), config, "nowhere").put(forged("nowhere", f"127.0.0.1:{free_port()}"))
    await RegistryWriter(nc.jetstream(), config, "garbage").put(b"\xff\xff not a heartbeat")

    router = await mesh.router(**JETSTREAM)
    assert [ep.worker_id for ep in router.router.registry.endpoints()] == [worker.worker_id]
    stub = mesh.stub(router)
    placed = {(await generate(stub, request([i] * 40)))[2] for i in range(20)}
    assert placed == {worker.worker_id}


async def test_without_jetstream_the_router_starts_on_heartbeats(mesh: Mesh) -> None:
    await mesh.worker(**JETSTREAM)
    router = await mesh.router(registry_store="jetstream", registry_bucket="bad name with spaces")
    await wait_until(lambda: len(router.router.registry) == 1, what="worker joined by heartbeat")
