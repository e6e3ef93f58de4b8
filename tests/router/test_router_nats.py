"""Router against real NATS and in-process mocker workers: events, recovery, discovery."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from services.api import worker_pb2_grpc
from services.common import subjects
from tests.router.conftest import Mesh, cached_blocks, generate, request, wait_until

PREFIXES = [[p * 1000 + i for i in range(160)] for p in range(12)]


def random_prompt(rng: random.Random) -> list[int]:
    prefix = rng.choice(PREFIXES)[: rng.randrange(16, 161)]
    return prefix + [rng.randrange(50_000, 60_000) for _ in range(rng.randrange(1, 40))]


def index_matches(mesh: Mesh, router_index: int = 0) -> bool:
    index = mesh.routers[router_index].router.index
    return all(index.blocks(w.worker_id) == cached_blocks(w) for w in mesh.workers)


async def run_random(mesh: Mesh, n: int, seed: int, concurrency: int = 32) -> None:
    rng = random.Random(seed)
    stub = mesh.stub(mesh.routers[0])
    sem = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with sem:
            tokens, final, _ = await generate(stub, request(random_prompt(rng), max_tokens=rng.randrange(1, 4)))
            assert final.finish_reason and len(tokens) == final.usage.completion_tokens

    await asyncio.gather(*(one() for _ in range(n)))


async def test_index_matches_real_block_sets_after_1000_random_requests(mesh: Mesh) -> None:
    for _ in range(3):
        await mesh.worker(num_blocks=160)  # small caches: plenty of evictions
    router = await mesh.router()
    await wait_until(lambda: len(router.router.registry) == 3, what="workers discovered")
    await run_random(mesh, 1000, seed=1)
    await wait_until(lambda: index_matches(mesh), timeout=5, what="index == workers' block sets")
    assert router.router.index.events_applied > 100
    assert all(router.router.index.block_count(w.worker_id) > 0 for w in mesh.workers)


async def test_restarted_router_and_replicas_recover_by_dump(mesh: Mesh) -> None:
    for _ in range(2):
        await mesh.worker()
    first = await mesh.router()
    await wait_until(lambda: len(first.router.registry) == 2, what="workers discovered")
    await run_random(mesh, 100, seed=2)
    await wait_until(lambda: index_matches(mesh), what="first router synced")
    await first.stop()
    mesh.routers.remove(first)
    # Meanwhile the workers' caches change with no router listening.
    for w in mesh.workers:
        import grpc

        async with grpc.aio.insecure_channel(w.address) as channel:
            stub: Any = worker_pb2_grpc.WorkerStub(channel)
            await generate(stub, request([*PREFIXES[5][:100], 7, 7, 7]))
    # A restarted router and a second replica beside it both catch up within a second.
    restarted = await mesh.router()
    replica = await mesh.router()
    took = await wait_until(lambda: index_matches(mesh, 0) and index_matches(mesh, 1), timeout=1.0,
                            what="restarted router and replica synced")
    assert took < 1.0
    assert restarted.recoverer.dumps >= 2 and replica.recoverer.dumps >= 2
    prompt = [*PREFIXES[5][:100], 7, 7, 7]
    best = {r.router.place(prompt).candidates[0].overlap_blocks for r in (restarted, replica)}
    assert best == {6}


async def test_dropped_events_are_detected_and_repaired(mesh: Mesh) -> None:
    worker = await mesh.worker()
    router = await mesh.router()
    await wait_until(lambda: len(router.router.registry) == 1, what="worker discovered")
    nc: Any = worker.publisher._nc
    real_publish = nc.publish
    to_drop = [2]  # lose the next two batches on the way
    kv_subject = subjects.kv_events(mesh.namespace, worker.worker_id)

    async def lossy_publish(subject: str, payload: bytes = b"", **kw: Any) -> None:
        if subject == kv_subject and to_drop[0] > 0:
            to_drop[0] -= 1
            return
        await real_publish(subject, payload, **kw)

    nc.publish = lossy_publish
    stub = mesh.stub(router)
    await generate(stub, request([*PREFIXES[0][:64], 1]))
    await generate(stub, request([*PREFIXES[1][:64], 1]))
    assert to_drop == [0]
    # No later event arrives: the heartbeat's last_event_id gives the lost tail away.
    await wait_until(lambda: index_matches(mesh), timeout=3, what="gap repaired from the heartbeat")
    assert router.recoverer.replays == 1
    to_drop[0] = 1  # one more loss, followed at once by a later event: a gap in event ids
    await generate(stub, request([*PREFIXES[2][:64], 1]))
    await generate(stub, request([*PREFIXES[3][:64], 1]))
    await wait_until(lambda: index_matches(mesh), timeout=3, what="gap repaired by replay")
    assert router.recoverer.replays == 2


async def test_gap_beyond_the_ring_buffer_is_repaired_by_a_dump(mesh: Mesh) -> None:
    worker = await mesh.worker(event_buffer=1)
    router = await mesh.router()
    await wait_until(lambda: len(router.router.registry) == 1, what="worker discovered")
    nc: Any = worker.publisher._nc
    real_publish = nc.publish
    kv_subject = subjects.kv_events(mesh.namespace, worker.worker_id)
    drop = [True]

    async def lossy_publish(subject: str, payload: bytes = b"", **kw: Any) -> None:
        if subject == kv_subject and drop[0]:
            drop[0] = False
            return
        await real_publish(subject, payload, **kw)

    nc.publish = lossy_publish
    stub = mesh.stub(router)
    for p in range(4):
        await generate(stub, request([*PREFIXES[p][:80], 2]))
    await wait_until(lambda: index_matches(mesh), timeout=3, what="gap repaired by dump")
    assert router.recoverer.dumps >= 2  # the join dump and the repair


async def test_workers_joining_and_leaving_are_noticed(mesh: Mesh) -> None:
    router = await mesh.router()
    a = await mesh.worker()
    await wait_until(lambda: router.router.registry.get(a.worker_id) is not None, what="join")
    b = await mesh.worker()
    await wait_until(lambda: len(router.router.registry) == 2, what="second join")
    await generate(mesh.stub(router), request([*PREFIXES[0][:64], 3]))
    await b.stop()
    mesh.workers.remove(b)
    await wait_until(lambda: router.router.registry.get(b.worker_id) is None, timeout=1, what="leave")
    assert b.worker_id not in router.router.index.workers()
