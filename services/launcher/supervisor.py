"""One supervisor of child OS processes, used by ``harnessmesh up`` and ``harnessmesh replay --live``.

A :class:`Supervisor` spawns each service as ``python -m <module> <every option as a flag>``
(optionally with its stdout/stderr in ``<log_dir>/<name>.log``), waits until a child answers the gRPC
health check, and watches its children: with the ``on-failure`` policy a child that dies (a non-zero
status or a signal) is started again with the same options (same ports, same worker id) after a
backoff (0.5 s doubling to 8 s) while the others keep serving, until one dies more than
``max_restarts`` times within ``restart_window`` seconds (a crash loop: the mesh gives up and exits
non-zero); with ``never``, or when a child exits 0, the first exit stops everything. Stopping is
SIGTERM to every child (the newest first), SIGKILL to any still running after a grace period, then
whatever else it was given to stop (:meth:`Supervisor.adopt`, e.g. the nats-server).

Lifecycle events (``mesh.child_started``, ``mesh.child_exited``, ``mesh.child_restarted``,
``mesh.child_crash_loop``, ``mesh.child_killed``) go to the logger passed in; a child that dies during
start-up ends the start-up with :class:`RuntimeError` (the tail of its log file when it has one), a wait
past its deadline with :class:`TimeoutError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog

from services.common.grpc_util import check_health, open_channel
from services.common.settings import fields_of
from services.common.tls import PLAINTEXT, TlsFiles
from services.launcher.specs import ServiceSpec, child_argv, child_secrets

STOP_GRACE = 10.0  # seconds a child gets between SIGTERM and SIGKILL
RESTART_POLICIES = ("on-failure", "never")
BACKOFF_FIRST, BACKOFF_MAX = 0.5, 8.0  # seconds before a restart, doubling per restart inside the window
POLL = 0.1  # seconds between two start-up checks
LOG_TAIL = 2000  # characters of a dead child's log quoted in the start-up error


_HANDED_OUT: set[int] = set()  # ports free_port gave this process: never given twice


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago and that this process has not handed out before.

    The kernel may offer a port again once the probe socket is closed, and a child that binds with
    ``SO_REUSEPORT`` (every gRPC server) does not fail on a port another child holds: in a CI run the
    gateway's gRPC port came out equal to the router's, both bound it, and the start-up check reached the
    router. Remembering what was handed out rules that out for the ports the launcher picks itself.
    """
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise OSError("no loopback port left that this process has not handed out")


def reserve_ports(*ports: int | None) -> None:
    """Ports given on the command line (``--http-port`` ...): :func:`free_port` never hands them out. A caller
    that picked one with its own probe just before may get it offered again here (a test's HTTP port once came
    out as the parse service's, and the gateway could not listen)."""
    _HANDED_OUT.update(port for port in ports if port)


def deadline_in(seconds: float) -> float:
    """The event-loop time ``seconds`` from now (the ``deadline`` of the waits below)."""
    return asyncio.get_running_loop().time() + seconds


def past(deadline: float) -> bool:
    return asyncio.get_running_loop().time() > deadline


async def terminate(processes: Sequence[asyncio.subprocess.Process], grace: float) -> list[int]:
    """SIGTERM every running process, wait up to ``grace`` s for each, SIGKILL the rest; their indices."""
    for process in processes:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
    killed = []
    for i, process in enumerate(processes):
        try:
            await asyncio.wait_for(process.wait(), grace)
        except TimeoutError:
            killed.append(i)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    return killed


class Stoppable(Protocol):
    """Something else the supervisor stops after its children (nats-server)."""

    async def stop(self) -> None: ...


@dataclass
class Child:
    """One running service process."""

    name: str
    process: asyncio.subprocess.Process
    grpc_address: str
    log_path: Path | None = None
    spec: ServiceSpec | None = None
    settings: Any = None
    restarts: list[float] = field(default_factory=list)  # event-loop times of its restarts

    def log_tail(self) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return ""
        return self.log_path.read_text(errors="replace")[-LOG_TAIL:]

    def describe(self) -> str:
        """``name`` and where it was to listen (its ``*port`` options, and its gRPC address), for start-up errors."""
        ports = [f"{f.name} {getattr(self.settings, f.name)}" for f in fields_of(type(self.settings))
                 if f.name.endswith("port") and getattr(self.settings, f.name)] if self.settings is not None else []
        return f"{self.name} ({', '.join([f'gRPC {self.grpc_address}', *ports])})"


class Supervisor:
    """The child processes of one mesh (see module docstring).

    ``log_dir``: each child's stdout/stderr go to ``<log_dir>/<name>.log`` (None: inherited).
    ``log``: the structlog logger of the lifecycle events (None: ``structlog.get_logger()``).
    ``restart``: ``on-failure`` or ``never``; ``max_restarts`` per ``restart_window`` seconds before giving up.
    ``tls``: the TLS files the children use, for the supervisor's own health checks.
    """

    def __init__(self, *, log_dir: Path | None = None, log: Any = None, grace: float = STOP_GRACE,
                 restart: str = "never", max_restarts: int = 5, restart_window: float = 60.0,
                 tls: TlsFiles = PLAINTEXT) -> None:
        if restart not in RESTART_POLICIES:
            raise ValueError(f"restart policy {restart!r}: expected one of {', '.join(RESTART_POLICIES)}")
        self.log_dir = log_dir
        self.log = log if log is not None else structlog.get_logger()
        self.grace = grace
        self.restart = restart
        self.max_restarts = max_restarts
        self.restart_window = restart_window
        self.tls = tls  # the children's TLS files: health checks go over mutual TLS too
        self.children: list[Child] = []
        self._adopted: list[Stoppable] = []

    def adopt(self, other: Stoppable) -> None:
        """Stop ``other`` too, after the children (adopted last, stopped first among the adopted)."""
        self._adopted.append(other)

    async def spawn(self, name: str, spec: ServiceSpec, settings: Any, grpc_address: str) -> Child:
        """Start ``python -m spec.module`` with every field of ``settings`` spelled out as a flag."""
        process = await self._start(name, spec, settings, append=False)
        log_path = self.log_dir / f"{name}.log" if self.log_dir is not None else None
        child = Child(name, process, grpc_address, log_path, spec=spec, settings=settings)
        self.children.append(child)
        self.log.info("mesh.child_started", name=name, pid=process.pid, address=grpc_address)
        return child

    async def _start(self, name: str, spec: ServiceSpec, settings: Any, *, append: bool,
                     ) -> asyncio.subprocess.Process:
        log_file = None
        if self.log_dir is not None:  # a restarted child's log follows its previous run's
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log_file = (self.log_dir / f"{name}.log").open("ab" if append else "wb")
        try:
            return await asyncio.create_subprocess_exec(
                sys.executable, *child_argv(spec, settings), stdout=log_file, stderr=log_file,
                env={**os.environ, **child_secrets(spec, settings)})  # secrets by environment, never argv
        finally:
            if log_file is not None:
                log_file.close()  # the child holds its own descriptor

    def check_alive(self) -> None:
        """Raise :class:`RuntimeError` if any child has exited (call while starting up)."""
        for child in self.children:
            status = child.process.returncode
            if status is not None:
                tail = child.log_tail()
                raise RuntimeError(f"{child.describe()} exited with status {status} during start-up"
                                   + (f":\n{tail}" if tail else " (its start_failed line says why)"))

    async def wait_healthy(self, children: Sequence[Child], deadline: float) -> None:
        """Wait until each child's gRPC health check says SERVING."""
        for child in children:
            channel = open_channel(child.grpc_address, None, self.tls)
            try:
                while not await check_health(channel, 0.5):
                    self.check_alive()
                    if past(deadline):
                        raise TimeoutError(f"{child.name} did not become healthy at {child.grpc_address}")
                    await asyncio.sleep(POLL)
            finally:
                await channel.close(None)

    async def watch(self, stop: asyncio.Event) -> int:
        """Run until ``stop`` (0) or until a child's exit ends the mesh (1): with ``never``, a child that
        exits 0, or a crash loop. Other deaths restart the child (see module docstring)."""
        loop = asyncio.get_running_loop()
        stopper = asyncio.create_task(stop.wait())
        waits = {asyncio.create_task(c.process.wait()): c for c in self.children}
        try:
            while True:
                done, _ = await asyncio.wait([*waits, stopper], return_when=asyncio.FIRST_COMPLETED)
                if stopper in done:
                    return 0
                for task in done:
                    child = waits.pop(task)
                    status = child.process.returncode
                    self.log.error("mesh.child_exited", name=child.name, status=status, pid=child.process.pid)
                    if self.restart == "never" or status == 0 or child.spec is None:
                        return 1
                    now = loop.time()
                    child.restarts = [t for t in child.restarts if now - t < self.restart_window]
                    if len(child.restarts) >= self.max_restarts:
                        self.log.error("mesh.child_crash_loop", name=child.name, restarts=len(child.restarts),
                                       window_s=self.restart_window)
                        return 1
                    backoff = min(BACKOFF_FIRST * 2 ** len(child.restarts), BACKOFF_MAX)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(asyncio.shield(stopper), backoff)
                    if stop.is_set():
                        return 0
                    child.restarts.append(loop.time())
                    child.process = await self._start(child.name, child.spec, child.settings, append=True)
                    self.log.warning("mesh.child_restarted", name=child.name, pid=child.process.pid,
                                     previous_status=status, restarts=len(child.restarts), backoff_s=backoff)
                    waits[asyncio.create_task(child.process.wait())] = child
        finally:
            for task in [*waits, stopper]:
                task.cancel()

    async def stop(self) -> None:
        """Stop every child (newest first), then what was adopted; safe to call again."""
        children = list(reversed(self.children))
        self.children.clear()
        for i in await terminate([c.process for c in children], self.grace):
            self.log.warning("mesh.child_killed", name=children[i].name)
        adopted, self._adopted = list(reversed(self._adopted)), []
        for other in adopted:
            await other.stop()
