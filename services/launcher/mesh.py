"""Start, watch and stop the whole mesh as separate OS processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import sys
from dataclasses import dataclass, field
from typing import Any

import structlog

from services.api import router_pb2, router_pb2_grpc
from services.common.grpc_util import check_health, open_channel
from services.launcher.nats_server import NatsServer
from services.launcher.services import GATEWAY, PARSE, ROUTER, WORKER, ServiceSpec, build_settings, child_argv
from services.launcher.settings import LauncherSettings

log = structlog.get_logger()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Child:
    """One running service process."""

    name: str
    process: asyncio.subprocess.Process
    grpc_address: str


@dataclass
class Endpoints:
    """What a user needs to reach the running mesh."""

    http: str
    grpc: str
    nats: str
    workers: list[str] = field(default_factory=list)
    metrics: dict[str, str] = field(default_factory=dict)  # process name -> its /metrics URL


class Mesh:
    """The mesh's processes. ``values`` are the parsed service options of ``harnessmesh up``."""

    def __init__(self, launcher: LauncherSettings, values: dict[str, Any]) -> None:
        self.launcher = launcher
        self.values = values
        self.children: list[Child] = []
        self.nats: NatsServer | None = None
        self.endpoints: Endpoints | None = None
        self.metrics: dict[str, str] = {}

    def _metrics_port(self, name: str) -> int:
        """A free port for ``name``'s /metrics endpoint, remembered for the ready line."""
        port = free_port()
        self.metrics[name] = f"http://127.0.0.1:{port}/metrics"
        return port

    async def _spawn(self, spec: ServiceSpec, name: str, overrides: dict[str, Any], grpc_address: str) -> Child:
        settings = build_settings(spec.settings_class(), self.values, overrides)
        process = await asyncio.create_subprocess_exec(sys.executable, *child_argv(spec, settings))
        child = Child(name, process, grpc_address)
        self.children.append(child)
        log.info("mesh.child_started", name=name, pid=process.pid, address=grpc_address)
        return child

    async def _wait_healthy(self, child: Child, deadline: float) -> None:
        channel = open_channel(child.grpc_address, None)
        try:
            while not await check_health(channel, 0.5):
                self._check_alive(child)
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"{child.name} did not become healthy at {child.grpc_address}")
                await asyncio.sleep(0.1)
        finally:
            await channel.close(None)

    @staticmethod
    def _check_alive(child: Child) -> None:
        if child.process.returncode is not None:
            raise RuntimeError(f"{child.name} exited with status {child.process.returncode} during start-up")

    async def start(self) -> Endpoints:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.launcher.startup_timeout
        nats_url = self.launcher.nats_url
        if not nats_url:
            self.nats = NatsServer(self.launcher.nats_port or free_port())
            await self.nats.start(self.launcher.startup_timeout)
            nats_url = self.nats.url
            log.info("mesh.nats_started", url=nats_url)
        wiring = {"nats_url": nats_url, "host": "127.0.0.1"}

        router_addr = f"127.0.0.1:{free_port()}"
        router = await self._spawn(ROUTER, "router", {**wiring, "port": int(router_addr.rsplit(":", 1)[1]),
                                                     "metrics_port": self._metrics_port("router")}, router_addr)
        workers = []
        for i in range(self.launcher.workers):
            port = free_port()
            overrides = {**wiring, "port": port, "advertise_host": "127.0.0.1", "worker_id": f"worker-{i}",
                         "metrics_port": self._metrics_port(f"worker-{i}")}
            workers.append(await self._spawn(WORKER, f"worker-{i}", overrides, f"127.0.0.1:{port}"))
        await self._wait_healthy(router, deadline)
        for worker in workers:
            await self._wait_healthy(worker, deadline)
        await self._wait_router_sees(router, len(workers), deadline)

        parse_addr = f"127.0.0.1:{free_port()}"
        parse = await self._spawn(PARSE, "parse", {**wiring, "port": int(parse_addr.rsplit(":", 1)[1]),
                                                   "router_address": router_addr,
                                                   "metrics_port": self._metrics_port("parse")}, parse_addr)
        await self._wait_healthy(parse, deadline)

        http_port = self.values.get("http_port") or free_port()
        grpc_port = self.values.get("grpc_port") or free_port()
        host = self.values.get("host") or "127.0.0.1"
        gateway = await self._spawn(
            GATEWAY, "gateway",
            {"http_port": http_port, "grpc_port": grpc_port, "parse_address": parse_addr, "host": host},
            f"127.0.0.1:{grpc_port}",
        )
        await self._wait_healthy(gateway, deadline)
        await self._wait_http_ready(gateway, http_port, deadline)
        self.endpoints = Endpoints(
            http=f"http://127.0.0.1:{http_port}",
            grpc=f"127.0.0.1:{grpc_port}",
            nats=nats_url,
            workers=[w.grpc_address for w in workers],
            metrics={"gateway": f"http://127.0.0.1:{http_port}/metrics", **self.metrics},
        )
        return self.endpoints

    async def _wait_router_sees(self, router: Child, count: int, deadline: float) -> None:
        channel = open_channel(router.grpc_address, None)
        stub = router_pb2_grpc.RouterStub(channel)
        try:
            while True:
                self._check_alive(router)
                with contextlib.suppress(Exception):
                    reply = await stub.ListWorkers(router_pb2.ListWorkersRequest(), timeout=1.0)
                    if len(reply.workers) >= count:
                        return
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"router did not discover {count} workers")
                await asyncio.sleep(0.1)
        finally:
            await channel.close(None)

    async def _wait_http_ready(self, gateway: Child, port: int, deadline: float) -> None:
        while True:
            self._check_alive(gateway)
            with contextlib.suppress(OSError):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /ready HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                await writer.drain()
                status_line = await reader.readline()
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
                if b" 200 " in status_line:
                    return
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError("gateway did not become ready")
            await asyncio.sleep(0.1)

    async def watch(self, stop: asyncio.Event) -> int:
        """Wait for ``stop`` (0) or for any child to die (1)."""
        waits = {asyncio.create_task(c.process.wait()): c for c in self.children}
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([*waits, stopper], return_when=asyncio.FIRST_COMPLETED)
        for task in [*waits, stopper]:
            if task not in done:
                task.cancel()
        dead = [waits[t] for t in done if t in waits]
        for child in dead:
            log.error("mesh.child_exited", name=child.name, status=child.process.returncode)
        return 1 if dead else 0

    async def stop(self) -> None:
        for child in reversed(self.children):
            if child.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGTERM)
        for child in reversed(self.children):
            try:
                await asyncio.wait_for(child.process.wait(), 10)
            except TimeoutError:
                log.warning("mesh.child_killed", name=child.name)
                child.process.kill()
                await child.process.wait()
        if self.nats is not None:
            await self.nats.stop()
        log.info("mesh.stopped")


def ready_line(endpoints: Endpoints) -> str:
    """The one machine-readable line ``harnessmesh up`` prints on stdout once the mesh is ready."""
    return json.dumps({"event": "mesh.ready", "http": endpoints.http, "grpc": endpoints.grpc,
                       "nats": endpoints.nats, "workers": endpoints.workers, "metrics": endpoints.metrics})
