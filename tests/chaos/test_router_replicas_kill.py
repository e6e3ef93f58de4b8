"""Two real router processes behind the parse service's router pool: streams spread over both, and one
router killed (SIGKILL) under load costs a retrying client no request (retry before the first frame,
resume after it, ``services/parse/router_stream.py``)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from services.api import router_pb2, router_pb2_grpc
from services.common.prompt_reuse import ReusingStub, prompt_key
from services.launcher.supervisor import free_port
from services.parse.router_pool import RouterPool
from services.parse.router_stream import ResumingRouterStream
from tests.router.conftest import Mesh, request

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

MAX_TOKENS = 16


@pytest.fixture
async def mesh(nats_url: str) -> AsyncIterator[Mesh]:
    m = Mesh(nats_url)
    yield m
    await m.close()


@contextmanager
def router_process(mesh: Mesh, port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    args = [sys.executable, "-m", "services.router", "--port", str(port), "--nats-url", mesh.nats_url,
            "--namespace", mesh.namespace, "--worker-timeout", "1", "--log-level", "warning"]
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def wait_serving(address: str, workers: int) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        for _ in range(300):
            try:
                listed = await stub.ListWorkers(router_pb2.ListWorkersRequest(), timeout=1)
                if len(listed.workers) == workers:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError(f"router {address} never listed {workers} workers")


async def one(stub: ReusingStub, i: int) -> int:
    tokens = [i * 1000 + t for t in range(40)]
    generate = request(tokens, max_tokens=MAX_TOKENS)
    packed = generate.token_ids_u32
    stream = ResumingRouterStream(stub, generate, prompt=packed, key=prompt_key("", packed), retry=10.0)
    got = 0
    final = None
    async for frame in stream:
        got += len(frame.token_ids)
        final = frame
    assert final is not None and final.usage.completion_tokens == MAX_TOKENS == got
    return got


async def test_streams_spread_over_two_routers_and_a_killed_one_fails_no_request(mesh: Mesh, tmp_path: Path) -> None:
    for _ in range(2):
        await mesh.worker(speedup=20.0)  # slow enough that streams are in flight when a router dies
    ports = [free_port(), free_port()]
    with router_process(mesh, ports[0], tmp_path / "r0.log") as r0, \
            router_process(mesh, ports[1], tmp_path / "r1.log"):
        for port in ports:
            await wait_serving(f"127.0.0.1:{port}", 2)
        pool = RouterPool([f"127.0.0.1:{port}" for port in ports], down_for=2.0)
        await pool.start()
        stub = ReusingStub(pool.replicas, retry_unavailable=10.0)
        try:
            await asyncio.gather(*(one(stub, i) for i in range(40)))
            streams = {r.address: r.streams for r in pool.replicas.replicas}
            assert all(n >= 15 for n in streams.values()), streams  # both routers served

            async def kill_soon() -> None:
                await asyncio.sleep(0.3)
                os.kill(r0.pid, signal.SIGKILL)

            killer = asyncio.create_task(kill_soon())

            async def client(n: int) -> list[int | BaseException]:  # steady load until 10 requests after the kill
                out: list[int | BaseException] = []
                after = 0
                while after < 10:
                    after += killer.done()
                    try:
                        out.append(await one(stub, 100 + n * 1000 + len(out)))
                    except Exception as exc:
                        out.append(exc)
                return out

            results = [r for rs in await asyncio.gather(*(client(n) for n in range(6))) for r in rs]
            failed = [r for r in results if isinstance(r, BaseException)]
            assert not failed and len(results) >= 60, failed[:3]
            assert r0.wait(5) == -signal.SIGKILL
            assert pool.replicas.failovers > 0  # streams went to the survivor meanwhile
        finally:
            await pool.close()
