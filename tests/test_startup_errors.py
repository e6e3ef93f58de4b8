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
