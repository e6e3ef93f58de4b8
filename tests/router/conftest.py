"""Real-NATS fixtures for router integration tests: in-process workers and routers on a fresh namespace."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from services.api import common_pb2, router_pb2_grpc, worker_pb2
from services.common import token_bytes
from services.router.server import RunningRouter, start_router
from services.router.settings import RouterSettings
from services.worker.server import RunningWorker, start_worker
from services.worker.settings import WorkerSettings


async def wait_until(cond: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> float:
    """Poll ``cond`` until true; return the seconds it took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not cond():
        if loop.time() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)
    return loop.time() - start


def cached_blocks(worker: RunningWorker) -> set[int]:
    """Every full block the worker's mocker engine holds (all inactive once requests finished)."""
    engine: Any = worker.engine
    return set(engine.blocks.lru_order())


@dataclass
class Mesh:
    """Workers and routers of one test, sharing a NATS namespace."""

    nats_url: str
    namespace: str = field(default_factory=lambda: f"t{secrets.token_hex(4)}")
    workers: list[RunningWorker] = field(default_factory=list)
    routers: list[RunningRouter] = field(default_factory=list)
    _channels: list[grpc.aio.Channel] = field(default_factory=list)

    async def worker(self, **kw: Any) -> RunningWorker:
        opts: dict[str, Any] = {"speedup": 1000.0, "block_size": 16, "num_blocks": 512, "heartbeat_interval": 0.2}
        opts.update(kw)
        w = await start_worker(WorkerSettings(nats_url=self.nats_url, namespace=self.namespace, **opts))
        self.workers.append(w)
        return w

    async def router(self, **kw: Any) -> RunningRouter:
        opts: dict[str, Any] = {"port": 0, "worker_timeout": 1.0}
        opts.update(kw)
        r = await start_router(RouterSettings(nats_url=self.nats_url, namespace=self.namespace, **opts))
        self.routers.append(r)
        return r

    def stub(self, router: RunningRouter) -> router_pb2_grpc.RouterStub:
        channel = grpc.aio.insecure_channel(router.address)
        self._channels.append(channel)
        return router_pb2_grpc.RouterStub(channel)

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
        for r in self.routers:
            await r.stop()
        for w in self.workers:
            await w.stop(0)


@pytest.fixture
async def mesh(nats_url: str) -> AsyncIterator[Mesh]:
    m = Mesh(nats_url)
    yield m
    await m.close()


def request(tokens: list[int], max_tokens: int = 2, priority: int = 0, **kw: Any) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(
        token_ids_u32=token_bytes.pack(tokens),
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        hints=common_pb2.AgentHints(priority=priority), **kw)


async def generate(stub: router_pb2_grpc.RouterStub, req: worker_pb2.GenerateRequest,
                   on_frame: Callable[[worker_pb2.GenerateResponse], Awaitable[None] | None] | None = None,
                   ) -> tuple[list[int], worker_pb2.GenerateResponse, str]:
    """Run one stream: (tokens, final frame, worker id of the first frame)."""
    tokens: list[int] = []
    worker = ""
    last = worker_pb2.GenerateResponse()
    async for frame in stub.Generate(req):
        if frame.HasField("prompt") and not worker:
            worker = frame.prompt.worker_id
        tokens.extend(frame.token_ids)
        last = frame
        if on_frame is not None:
            result = on_frame(frame)
            if result is not None:
                await result
    return tokens, last, worker
