"""A live mesh for ``harnessmesh replay --live``: nats-server, one router and N mocker workers as OS processes.

The workers run the simulator's engine configuration (block size, blocks, batching limits) and its timing
model (``--timing-model dynamo``) with ``--speedup`` set to the time-compression factor, so one wall-clock
second of this mesh is ``compression`` seconds of the simulator's clock. The workers get a copy of the demo
model whose context is long enough for any trace prompt (the simulator does not bound prompt length).
This is an adapter (processes, gRPC); the domain code of ``sim/`` stays free of both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from services.api import router_pb2, router_pb2_grpc
from services.common.grpc_util import check_health, open_channel
from services.common.model_dir import load_model_dir
from services.launcher.mesh import free_port
from services.launcher.nats_server import NatsServer
from services.launcher.services import ROUTER, WORKER, child_argv
from services.router.policy import DEFAULT_OVERLAP_WEIGHT
from services.router.settings import RouterSettings
from services.worker.settings import WorkerSettings

LONG_CONTEXT = 1 << 20  # tokens: above any Mooncake prompt


@dataclass(frozen=True)
class LiveMeshConfig:
    """The mesh to start: the simulator's :class:`ReplayConfig` knobs plus the time compression."""

    workers: int = 2
    mode: str = "kv"
    block_size: int = 64
    num_blocks: int = 16384
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    overlap_weight: float = DEFAULT_OVERLAP_WEIGHT
    temperature: float = 0.0
    compression: float = 1.0
    startup_timeout: float = 60.0
    log_dir: str = ""  # children's stdout/stderr go to <log_dir>/<name>.log (empty: a temporary dir)


def long_context_model(dest: Path) -> Path:
    """A copy of the demo model (tokenizer, template) whose context is :data:`LONG_CONTEXT` tokens."""
    src = load_model_dir("").path
    dest.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_file():
            shutil.copy2(item, dest / item.name)
    config = json.loads((dest / "config.json").read_text()) if (dest / "config.json").is_file() else {}
    config["max_position_embeddings"] = LONG_CONTEXT
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    return dest


class LiveMesh:
    """Starts and stops the processes; :attr:`router_address` is where to send the trace."""

    def __init__(self, config: LiveMeshConfig) -> None:
        self.config = config
        self._tmp = tempfile.TemporaryDirectory(prefix="harnessmesh-replay-")
        self.log_dir = Path(config.log_dir or self._tmp.name)
        self.nats: NatsServer | None = None
        self.processes: list[tuple[str, asyncio.subprocess.Process, IO[bytes]]] = []
        self.router_address = ""

    async def _spawn(self, name: str, argv: list[str]) -> asyncio.subprocess.Process:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.log_dir / f"{name}.log").open("wb")
        process = await asyncio.create_subprocess_exec(sys.executable, *argv, stdout=log, stderr=log)
        self.processes.append((name, process, log))
        return process

    def _check_alive(self) -> None:
        for name, process, _ in self.processes:
            if process.returncode is not None:
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited with status {process.returncode}:\n{tail}")

    async def start(self) -> str:
        c = self.config
        loop = asyncio.get_running_loop()
        deadline = loop.time() + c.startup_timeout
        self.nats = NatsServer(free_port())
        await self.nats.start(c.startup_timeout)
        common: dict[str, Any] = {"nats_url": self.nats.url, "log_level": "warning", "host": "127.0.0.1"}
        router_port = free_port()
        self.router_address = f"127.0.0.1:{router_port}"
        router = RouterSettings(**common, port=router_port, router_mode=c.mode, overlap_weight=c.overlap_weight,
                                router_temperature=c.temperature, worker_timeout=30.0, stall_timeout=600.0)
        router.validate()
        await self._spawn("router", child_argv(ROUTER, router))
        model = long_context_model(Path(self._tmp.name) / "model")
        addresses = []
        for i in range(c.workers):
            port = free_port()
            worker = WorkerSettings(
                **common, port=port, advertise_host="127.0.0.1", worker_id=f"worker-{i}", engine="mocker",
                model=str(model), block_size=c.block_size, num_blocks=c.num_blocks, max_num_seqs=c.max_num_seqs,
                max_num_batched_tokens=c.max_num_batched_tokens, timing_model="dynamo", speedup=c.compression,
                heartbeat_interval=0.5)
            worker.validate()
            await self._spawn(f"worker-{i}", child_argv(WORKER, worker))
            addresses.append(f"127.0.0.1:{port}")
        for address in [self.router_address, *addresses]:
            await self._wait_healthy(address, deadline)
        await self._wait_router_sees(c.workers, deadline)
        return self.router_address

    async def _wait_healthy(self, address: str, deadline: float) -> None:
        channel = open_channel(address, None)
        try:
            while not await check_health(channel, 0.5):
                self._check_alive()
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"{address} did not become healthy")
                await asyncio.sleep(0.1)
        finally:
            await channel.close(None)

    async def _wait_router_sees(self, count: int, deadline: float) -> None:
        channel = open_channel(self.router_address, None)
        stub = router_pb2_grpc.RouterStub(channel)
        try:
            while True:
                self._check_alive()
                with contextlib.suppress(Exception):
                    reply = await stub.ListWorkers(router_pb2.ListWorkersRequest(), timeout=1.0)
                    if len(reply.workers) >= count:
                        return
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"the router did not discover {count} workers")
                await asyncio.sleep(0.1)
        finally:
            await channel.close(None)

    async def stop(self) -> None:
        for _, process, _ in reversed(self.processes):
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
        for _, process, log in reversed(self.processes):
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()
            log.close()
        self.processes.clear()
        if self.nats is not None:
            await self.nats.stop()
            self.nats = None
        self._tmp.cleanup()


@contextlib.asynccontextmanager
async def live_mesh(config: LiveMeshConfig) -> AsyncIterator[LiveMesh]:
    """A started :class:`LiveMesh`, stopped on exit (also when start-up fails)."""
    mesh = LiveMesh(config)
    try:
        await mesh.start()
        yield mesh
    finally:
        await mesh.stop()
