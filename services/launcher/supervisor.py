"""One supervisor of child OS processes, used by ``harnessmesh up`` and ``harnessmesh replay --live``.

A :class:`Supervisor` spawns each service as ``python -m <module> <every option as a flag>``
(optionally with its stdout/stderr in ``<log_dir>/<name>.log``), waits until a child answers the gRPC
health check, watches for the first child to exit, and stops everything: SIGTERM to every child (the
newest first), SIGKILL to any still running after a grace period, then whatever else it was given to
stop (:meth:`Supervisor.adopt`, e.g. the nats-server). Its users are thin drivers that decide what to
start in which order; restart policy is not this module's (yet).

Lifecycle events (``mesh.child_started``, ``mesh.child_exited``, ``mesh.child_killed``) go to the
logger passed in; a child that dies during start-up ends the start-up with :class:`RuntimeError`
(the tail of its log file when it has one), a wait past its deadline with :class:`TimeoutError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import structlog

from services.common.grpc_util import check_health, open_channel
from services.launcher.specs import ServiceSpec, child_argv

STOP_GRACE = 10.0  # seconds a child gets between SIGTERM and SIGKILL
POLL = 0.1  # seconds between two start-up checks
LOG_TAIL = 2000  # characters of a dead child's log quoted in the start-up error


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    log_file: IO[bytes] | None = None

    def log_tail(self) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return ""
        return self.log_path.read_text(errors="replace")[-LOG_TAIL:]


class Supervisor:
    """The child processes of one mesh (see module docstring).

    ``log_dir``: each child's stdout/stderr go to ``<log_dir>/<name>.log`` (None: inherited).
    ``log``: the structlog logger of the lifecycle events (None: ``structlog.get_logger()``).
    """

    def __init__(self, *, log_dir: Path | None = None, log: Any = None, grace: float = STOP_GRACE) -> None:
        self.log_dir = log_dir
        self.log = log if log is not None else structlog.get_logger()
        self.grace = grace
        self.children: list[Child] = []
        self._adopted: list[Stoppable] = []

    def adopt(self, other: Stoppable) -> None:
        """Stop ``other`` too, after the children (adopted last, stopped first among the adopted)."""
        self._adopted.append(other)

    async def spawn(self, name: str, spec: ServiceSpec, settings: Any, grpc_address: str) -> Child:
        """Start ``python -m spec.module`` with every field of ``settings`` spelled out as a flag."""
        log_path = log_file = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log_path = self.log_dir / f"{name}.log"
            log_file = log_path.open("wb")
        process = await asyncio.create_subprocess_exec(sys.executable, *child_argv(spec, settings),
                                                       stdout=log_file, stderr=log_file)
        child = Child(name, process, grpc_address, log_path, log_file)
        self.children.append(child)
        self.log.info("mesh.child_started", name=name, pid=process.pid, address=grpc_address)
        return child

    def check_alive(self) -> None:
        """Raise :class:`RuntimeError` if any child has exited (call while starting up)."""
        for child in self.children:
            status = child.process.returncode
            if status is not None:
                tail = child.log_tail()
                raise RuntimeError(f"{child.name} exited with status {status} during start-up"
                                   + (f":\n{tail}" if tail else ""))

    async def wait_healthy(self, children: Sequence[Child], deadline: float) -> None:
        """Wait until each child's gRPC health check says SERVING."""
        for child in children:
            channel = open_channel(child.grpc_address, None)
            try:
                while not await check_health(channel, 0.5):
                    self.check_alive()
                    if past(deadline):
                        raise TimeoutError(f"{child.name} did not become healthy at {child.grpc_address}")
                    await asyncio.sleep(POLL)
            finally:
                await channel.close(None)

    async def watch(self, stop: asyncio.Event) -> int:
        """Wait for ``stop`` (0) or for the first child to exit (1, logged as ``mesh.child_exited``)."""
        waits = {asyncio.create_task(c.process.wait()): c for c in self.children}
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([*waits, stopper], return_when=asyncio.FIRST_COMPLETED)
        for task in [*waits, stopper]:
            if task not in done:
                task.cancel()
        dead = [waits[t] for t in done if t in waits]
        for child in dead:
            self.log.error("mesh.child_exited", name=child.name, status=child.process.returncode)
        return 1 if dead else 0

    async def stop(self) -> None:
        """Stop every child (newest first), then what was adopted; safe to call again."""
        children = list(reversed(self.children))
        self.children.clear()
        for i in await terminate([c.process for c in children], self.grace):
            self.log.warning("mesh.child_killed", name=children[i].name)
        for child in children:
            if child.log_file is not None:
                child.log_file.close()
        adopted, self._adopted = list(reversed(self._adopted)), []
        for other in adopted:
            await other.stop()
