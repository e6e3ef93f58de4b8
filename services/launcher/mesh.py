"""``harnessmesh up``'s mesh: nats-server, the router, N workers, parse and the gateway, in that order.

A thin driver over :class:`~services.launcher.supervisor.Supervisor` (processes, health waits, watch,
stop) and :func:`~services.launcher.backend.start_backend` (router + workers): what it adds is the
order, the parse service and the gateway, the gateway's HTTP readiness, and the endpoints to print.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from services.launcher.backend import start_backend
from services.launcher.nats_server import NatsServer
from services.launcher.settings import UpSettings
from services.launcher.specs import GATEWAY, PARSE, build_settings
from services.launcher.supervisor import POLL, Supervisor, deadline_in, free_port, past, reserve_ports

log = structlog.get_logger()


@dataclass
class Endpoints:
    """What a user needs to reach the running mesh."""

    http: str
    grpc: str
    nats: str
    workers: list[str] = field(default_factory=list)
    nats_token_file: str = ""  # the started nats-server's token (0600), for your own NATS client
    metrics: dict[str, str] = field(default_factory=dict)  # process name -> its /metrics URL


class Mesh:
    """The mesh's processes. ``values`` are the parsed service options of ``harnessmesh up``."""

    def __init__(self, launcher: UpSettings, values: dict[str, Any]) -> None:
        self.launcher = launcher
        self.values = values
        self.supervisor = Supervisor(log=log, restart=launcher.restart, tls=launcher.tls())
        self.endpoints: Endpoints | None = None
        self._nats_token_file = ""
        self.metrics: dict[str, str] = {}

    def _metrics_port(self, name: str) -> dict[str, Any]:
        """A free port for ``name``'s /metrics endpoint, remembered for the ready line."""
        port = free_port()
        self.metrics[name] = f"http://127.0.0.1:{port}/metrics"
        return {"metrics_port": port}

    async def start(self) -> Endpoints:
        deadline = deadline_in(self.launcher.startup_timeout)
        self.launcher.tls().check()  # before anything starts: a missing file is one clear line
        _check_model(self.values)
        reserve_ports(self.values.get("http_port"), self.values.get("grpc_port"), self.launcher.nats_port)
        nats_url, nats_token = self.launcher.nats_url, self.launcher.nats_token
        if not nats_url:
            nats = NatsServer(self.launcher.nats_port or free_port(), self.launcher.tls())
            self.supervisor.adopt(nats)
            await nats.start(self.launcher.startup_timeout)
            nats_url, nats_token = nats.url, nats.token
            self._nats_token_file = str(nats.token_file)
            log.info("mesh.nats_started", url=nats_url, auth="token", tls=self.launcher.tls().enabled,
                     token_file=self._nats_token_file)
        backend = await start_backend(
            self.supervisor, workers=self.launcher.workers, nats_url=nats_url, nats_token=nats_token,
            deadline=deadline,
            values=self.values, router_options=self._metrics_port("router"), worker_options=self._metrics_port)

        parse_port = free_port()
        parse_addr = f"127.0.0.1:{parse_port}"
        state_nats = {"nats_url": nats_url, "nats_token": nats_token}  # the jetstream state stores (docs/state.md)
        parse = await self.supervisor.spawn("parse", PARSE, self._settings(PARSE.settings_class(), {
            **state_nats, "host": "127.0.0.1", "port": parse_port,
            "router_address": backend.router.grpc_address, **self._metrics_port("parse")}), parse_addr)
        await self.supervisor.wait_healthy([parse], deadline)

        http_port = self.values.get("http_port") or free_port()
        grpc_port = self.values.get("grpc_port") or free_port()
        host = self.values.get("host") or "127.0.0.1"
        gateway = await self.supervisor.spawn("gateway", GATEWAY, self._settings(GATEWAY.settings_class(), {
            "http_port": http_port, "grpc_port": grpc_port, "parse_address": parse_addr, "host": host,
            "max_concurrent_requests": self._max_concurrent(), **state_nats,
        }), f"127.0.0.1:{grpc_port}")
        await self.supervisor.wait_healthy([gateway], deadline)
        await self._wait_http_ready(http_port, deadline)
        self.endpoints = Endpoints(
            http=f"http://127.0.0.1:{http_port}",
            grpc=f"127.0.0.1:{grpc_port}",
            nats=nats_url,
            workers=[w.grpc_address for w in backend.workers],
            nats_token_file=self._nats_token_file,
            metrics={"gateway": f"http://127.0.0.1:{http_port}/metrics", **self.metrics},
        )
        return self.endpoints

    def _max_concurrent(self) -> int:
        """The gateway's admission limit: as given, else what the workers batch at once."""
        given = int(self.values.get("max_concurrent_requests") or 0)
        return given or self.launcher.workers * int(self.values.get("max_num_seqs") or 64)

    def _settings(self, cls: type[Any], overrides: dict[str, Any]) -> Any:
        return build_settings(cls, self.values, overrides)

    async def _wait_http_ready(self, port: int, deadline: float) -> None:
        """Wait until the gateway's ``GET /ready`` answers 200 (its gRPC health alone says nothing of HTTP)."""
        while True:
            self.supervisor.check_alive()
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
            if past(deadline):
                raise TimeoutError("gateway did not become ready")
            await asyncio.sleep(POLL)

    async def watch(self, stop: asyncio.Event) -> int:
        """Serve until ``stop`` (0) or until a child's death ends the mesh (1; see the supervisor's policy)."""
        return await self.supervisor.watch(stop)

    async def stop(self) -> None:
        await self.supervisor.stop()
        log.info("mesh.stopped")


def _check_model(values: dict[str, Any]) -> None:
    """A ``--model`` that is no directory fails here, naming it, not in each worker after NATS started."""
    model = str(values.get("model") or "")
    if model and not Path(model).is_dir():
        raise ValueError(f"--model {model!r}: no such directory (a Hugging Face model directory is expected)")


def ready_line(endpoints: Endpoints) -> str:
    """The one machine-readable line ``harnessmesh up`` prints on stdout once the mesh is ready."""
    return json.dumps({"event": "mesh.ready", "http": endpoints.http, "grpc": endpoints.grpc,
                       "nats": endpoints.nats, "nats_token_file": endpoints.nats_token_file,
                       "workers": endpoints.workers, "metrics": endpoints.metrics})
