"""What the worker registry in JetStream (``--registry-store jetstream``) costs, and what it buys (issue 18).

Starts a real nats-server with JetStream on loopback (the launcher's ``NatsServer``) and times:

- per heartbeat, on the worker: the core-NATS heartbeat (publish + flush) vs the registry write added
  beside it (one acknowledged JetStream put of the same ~100-byte record, in memory as the worker
  keeps it, and on file for comparison);
- on a starting router: reading every record of a registry of 1, 16, 128 and 512 workers;
- a router started after 4 in-process mocker workers: ``start_router`` until it returns, and how many
  workers it knows at that moment, heartbeats vs jetstream.

Prints medians. Usage: ``python bench/worker_registry.py [--rounds 300]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.api import kv_pb2, worker_pb2
from services.common import subjects
from services.common.jetstream import BucketConfig
from services.common.nats_util import close_nats, connect_nats
from services.common.worker_registry import RegistryWriter, read_records
from services.launcher.nats_server import NatsServer
from services.router.server import start_router
from services.router.settings import RouterSettings
from services.worker.server import start_worker
from services.worker.settings import WorkerSettings
from tests.support.nats import free_port


def record(i: int) -> bytes:
    info = worker_pb2.WorkerInfo(worker_id=f"worker-{i:08x}", grpc_address=f"10.0.{i // 256}.{i % 256}:50060",
                                 block_size=32, total_blocks=65536, model="Qwen/Qwen3-8B", engine="trtllm")
    return kv_pb2.WorkerHeartbeat(info=info, active_requests=12, active_blocks=4000,
                                  last_event_id=123456).SerializeToString()


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


async def per_heartbeat(nc: object, rounds: int) -> None:
    js = nc.jetstream()  # type: ignore[attr-defined]
    beat = record(1)
    core, mem, disk = [], [], []
    writers = {m: RegistryWriter(js, BucketConfig(f"bench_{m}", ttl=3.0, memory=m), "worker-1") for m in (True, False)}
    for _ in range(rounds):
        t = time.perf_counter()
        await nc.publish(subjects.heartbeat("bench"), beat)  # type: ignore[attr-defined]
        await nc.flush()  # type: ignore[attr-defined]
        core.append(time.perf_counter() - t)
        for memory, out in ((True, mem), (False, disk)):
            t = time.perf_counter()
            await writers[memory].put(beat)
            out.append(time.perf_counter() - t)
    print(f"per heartbeat ({len(beat)} B record): core publish+flush {median_us(core):.0f} us; "
          f"registry put: memory {median_us(mem):.0f} us, file {median_us(disk):.0f} us")


async def startup_read(nc: object) -> None:
    js = nc.jetstream()  # type: ignore[attr-defined]
    for n in (1, 16, 128, 512):
        config = BucketConfig(f"bench_fleet_{n}", ttl=60.0, memory=True)
        await asyncio.gather(*(RegistryWriter(js, config, f"worker-{i:08x}").put(record(i)) for i in range(n)))
        samples = []
        for _ in range(20):
            t = time.perf_counter()
            got = await read_records(js, config.name)
            samples.append(time.perf_counter() - t)
            assert len(got) == n
        print(f"router start: read {n:4d} records: {median_us(samples) / 1000:.2f} ms")


async def router_start(url: str, token: str) -> None:
    for store in ("heartbeats", "jetstream"):
        ns = f"bench_{store}"
        workers = [await start_worker(WorkerSettings(nats_url=url, nats_token=token, namespace=ns, registry_store=store,
                                                     speedup=1000, heartbeat_interval=30.0)) for _ in range(4)]
        try:
            took, known = [], []
            for _ in range(5):
                t = time.perf_counter()
                router = await start_router(RouterSettings(nats_url=url, nats_token=token, namespace=ns, port=0,
                                                           registry_store=store))
                took.append(time.perf_counter() - t)
                known.append(len(router.router.registry))
                await router.stop()
            print(f"start_router with 4 workers, {store}: {statistics.median(took) * 1000:.1f} ms, "
                  f"workers known when it returns: {known}")
        finally:
            for w in workers:
                await w.stop(0)


async def main(rounds: int) -> None:
    server = NatsServer(free_port())
    await server.start(10)
    try:
        nc = await connect_nats(server.url, "bench", token=server.token)
        try:
            await per_heartbeat(nc, rounds)
            await startup_read(nc)
        finally:
            await close_nats(nc)
        await router_start(server.url, server.token)
    finally:
        await server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    asyncio.run(main(parser.parse_args().rounds))
