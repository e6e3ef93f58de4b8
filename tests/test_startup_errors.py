"""Bad configuration ends a process with one clear line and status 1, never a hang or a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from services.common.errors import UnavailableError
from services.common.nats_util import connect_nats
from tests.support.nats import free_port


async def test_unreachable_nats_fails_fast_and_names_the_url() -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(UnavailableError, match=url):
        await connect_nats(url, "test", timeout=1.0)
    assert time.monotonic() - started < 5


async def test_reachable_nats_connects(nats_url: str) -> None:
    nc = await connect_nats(nats_url, "test", timeout=5.0)
    assert nc.is_connected
    await nc.close()


def test_bad_model_directory_is_one_error_line_and_status_1() -> None:
    done = subprocess.run([sys.executable, "-m", "services.worker", "--model", "/nonexistent/model"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    failed = [json.loads(line) for line in done.stderr.splitlines() if '"worker.start_failed"' in line]
    assert failed and "/nonexistent/model" in failed[0]["error"]


def test_port_in_use_is_one_error_line_and_status_1() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "services.worker", "--port", str(port)],
                              capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    failed = [json.loads(line) for line in done.stderr.splitlines() if '"worker.start_failed"' in line]
    assert failed and f"127.0.0.1:{port}" in failed[0]["error"]


def _start_failed(stderr: str, event: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in stderr.splitlines() if f'"{event}"' in line]


def test_gateway_http_port_in_use_names_the_port() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "gateway", "--http-port", str(port), "--grpc-port", "0",
                               "--parse-address", "127.0.0.1:1"],
                              capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    failed = _start_failed(done.stderr, "gateway.start_failed")
    assert failed and f"127.0.0.1:{port}" in failed[0]["error"] and "HTTP" in failed[0]["error"]


def test_up_with_a_missing_model_names_the_path_before_starting_anything() -> None:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "services.launcher", "up", "--http-port", "0", "--grpc-port", "0",
                           "--model", "/nonexistent/model"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    failed = _start_failed(done.stderr, "mesh.start_failed")
    assert failed and "/nonexistent/model" in failed[0]["error"]
    assert time.monotonic() - started < 20  # no NATS, router or worker was started first
    assert "mesh.child_started" not in done.stderr


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_up_with_its_http_port_in_use_says_which_port() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "services.launcher", "up", "--http-port", str(port),
                               "--grpc-port", str(free_port()), "--restart", "never"],
                              capture_output=True, text=True, timeout=110, check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    gateway = _start_failed(done.stderr, "gateway.start_failed")
    assert gateway and f"127.0.0.1:{port}" in gateway[0]["error"]
    mesh = _start_failed(done.stderr, "mesh.start_failed")
    assert mesh and f"http_port {port}" in mesh[0]["error"]
