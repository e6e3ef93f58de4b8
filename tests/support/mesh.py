"""Run the real mesh (``harnessmesh up``: nats-server, router, workers, parse, gateway) for a test."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.nats import free_port


@dataclass(frozen=True)
class RunningMesh:
    """Endpoints of a mesh started by :func:`running_mesh`."""

    http: str
    grpc: str
    nats: str
    workers: list[str]
    process: subprocess.Popen[bytes]
    log_path: Path
    metrics: dict[str, str] = field(default_factory=dict)  # process name -> /metrics URL
    nats_token: str = ""  # the mesh's NATS requires it


@contextmanager
def running_mesh(
    args: Sequence[str], log_path: Path, timeout: float = 120.0, env: dict[str, str] | None = None
) -> Iterator[RunningMesh]:
    """Start ``harnessmesh up ARGS`` on free ports; yield once it printed its ready line; stop it."""
    http_port, grpc_port = free_port(), free_port()
    argv = [sys.executable, "-m", "services.launcher", "up", "--http-port", str(http_port),
            "--grpc-port", str(grpc_port), *args]
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "none", **(env or {})}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, env=env)
        try:
            ready = _wait_ready(proc, timeout, log_path)
            token_file = ready.get("nats_token_file") or ""
            yield RunningMesh(ready["http"], ready["grpc"], ready["nats"], ready["workers"], proc, log_path,
                              ready.get("metrics", {}), Path(token_file).read_text() if token_file else "")
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _wait_ready(proc: subprocess.Popen[bytes], timeout: float, log_path: Path) -> dict[str, Any]:
    assert proc.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    buffer = b""
    while time.monotonic() < deadline:
        if not selector.select(timeout=0.5):
            if proc.poll() is not None:
                break
            continue
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            break
        buffer += chunk
        for line in buffer.splitlines():
            if line.startswith(b'{"event": "mesh.ready"'):
                ready: dict[str, Any] = json.loads(line)
                return ready
    proc.kill()
    raise RuntimeError(f"mesh did not become ready; launcher log:\n{log_path.read_text()[-5000:]}")
