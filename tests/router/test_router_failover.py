"""Router failure handling and admission with real NATS: SIGKILLed workers, migration, priority queue."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from services.api import worker_pb2
from tests.router.conftest import Mesh, generate, request, wait_until


@contextmanager
def worker_process(mesh: Mesh, worker_id: str, speedup: float) -> Iterator[subprocess.Popen[bytes]]:
    argv = [sys.executable, "-m", "services.worker", "--nats-url", mesh.nats_url, "--namespace", mesh.namespace,
            "--worker-id", worker_id, "--speedup", str(speedup), "--heartbeat-interval", "0.2"]
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "none"}
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.timeout(60)
async def test_sigkilled_worker_loses_no_stream(mesh: Mesh) -> None:
    router = await mesh.router(worker_timeout=1.0, stall_timeout=5.0)
    with worker_process(mesh, "victim", speedup=4) as victim, worker_process(mesh, "survivor", speedup=4):
        await wait_until(lambda: len(router.router.registry) == 2, timeout=20, what="both workers up")
        stub = mesh.stub(router)
        max_tokens = 300
        started: dict[int, str] = {}
        all_started = asyncio.Event()

        def tracker(i: int):  # type: ignore[no-untyped-def]
            def on_frame(frame: worker_pb2.GenerateResponse) -> None:
                if frame.HasField("prompt"):
                    started[i] = frame.prompt.worker_id
                    if len(started) == 6:
                        all_started.set()
            return on_frame

        streams = [asyncio.create_task(generate(stub, request([i * 100 + t for t in range(40)],
                                                              max_tokens=max_tokens), tracker(i)))
                   for i in range(6)]
        await asyncio.wait_for(all_started.wait(), 10)
        assert "victim" in started.values() and "survivor" in started.values()
        victim.send_signal(signal.SIGKILL)
        results = await asyncio.wait_for(asyncio.gather(*streams), 30)
    for tokens, final, _ in results:
        assert not final.HasField("error"), final.error.message
        assert len(tokens) == max_tokens
        assert final.usage.completion_tokens == max_tokens and final.usage.prompt_tokens == 40
    await wait_until(lambda: router.router.registry.get("victim") is None, timeout=3, what="victim expired")


async def test_migration_after_first_token_keeps_one_stream(mesh: Mesh) -> None:
    a = await mesh.worker(speedup=20)
    b = await mesh.worker(speedup=20)
    router = await mesh.router(stall_timeout=5.0)
    await wait_until(lambda: len(router.router.registry) == 2, what="workers discovered")
    stub = mesh.stub(router)
    stopped: list[str] = []

    async def stop_first_worker(frame: worker_pb2.GenerateResponse) -> None:
        if frame.HasField("prompt") and not stopped:
            victim = a if frame.prompt.worker_id == a.worker_id else b
            stopped.append(victim.worker_id)
            asyncio.get_running_loop().create_task(victim.stop(grace=0))

    tokens, final, first_worker = await generate(stub, request(list(range(50)), max_tokens=120), stop_first_worker)
    assert stopped == [first_worker]
    assert len(tokens) == 120 and final.usage.completion_tokens == 120 and final.usage.prompt_tokens == 50
    mesh.workers = [w for w in mesh.workers if w.worker_id != first_worker]


async def test_migration_disabled_gives_an_in_band_error(mesh: Mesh) -> None:
    a = await mesh.worker(speedup=20)
    await mesh.worker(speedup=20)
    router = await mesh.router(migration_limit=0)
    await wait_until(lambda: len(router.router.registry) == 2, what="workers discovered")
    workers = {w.worker_id: w for w in mesh.workers}

    async def kill(frame: worker_pb2.GenerateResponse) -> None:
        if frame.HasField("prompt"):
            asyncio.get_running_loop().create_task(workers[frame.prompt.worker_id].stop(grace=0))

    _, final, first = await generate(mesh.stub(router), request(list(range(50)), max_tokens=120), kill)
    assert final.HasField("error") and "migration limit" in final.error.message
    mesh.workers = [w for w in mesh.workers if w.worker_id != first]
    del a


async def test_high_priority_request_overtakes_queued_low_ones(mesh: Mesh) -> None:
    await mesh.worker(speedup=2)
    router = await mesh.router(queue_max_requests=1)
    await wait_until(lambda: len(router.router.registry) == 1, what="worker discovered")
    stub = mesh.stub(router)
    order: list[str] = []

    async def run(name: str, priority: int, max_tokens: int = 20) -> None:
        def on_frame(frame: worker_pb2.GenerateResponse) -> None:
            if frame.HasField("prompt"):
                order.append(name)
        await generate(stub, request([hash(name) % 1000 + t for t in range(20)], max_tokens=max_tokens,
                                     priority=priority), on_frame)

    tasks = [asyncio.create_task(run("busy", 0, max_tokens=150))]
    await wait_until(lambda: order == ["busy"], what="first request running")
    for i, (name, prio) in enumerate([("low1", 0), ("low2", 0), ("low3", 0), ("high", 10)]):
        tasks.append(asyncio.create_task(run(name, prio)))
        await wait_until(lambda n=i + 1: len(router.admission) == n, what=f"{name} queued")  # type: ignore[misc]
    await asyncio.gather(*tasks)
    assert order == ["busy", "high", "low1", "low2", "low3"]
