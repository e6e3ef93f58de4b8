"""Clean shutdown in any signal order: Ctrl-C or SIGTERM to the whole process group (every child gets it at
once, nats-server too) stops the mesh with status 0 and no traceback in any process's output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from services.launcher.supervisor import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_process_group_stops_everything_without_a_traceback(tmp_path: Path, sig: int) -> None:
    log_path = tmp_path / "mesh.log"
    argv = [sys.executable, "-m", "services.launcher", "up", "--http-port", str(free_port()),
            "--grpc-port", str(free_port()), "--workers", "2"]
    with log_path.open("wb") as log:
        mesh = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, start_new_session=True,
                                env={**os.environ, "OTEL_TRACES_EXPORTER": "none"})
        try:
            assert mesh.stdout is not None
            assert b"harnessmesh is up" in mesh.stdout.readline()
            os.killpg(mesh.pid, sig)  # a group of our own (start_new_session): only the mesh gets it
            assert mesh.wait(60) == 0
        finally:
            if mesh.poll() is None:
                os.killpg(mesh.pid, signal.SIGKILL)
                mesh.wait()
    text = log_path.read_text()
    assert "Traceback" not in text, text[-3000:]
    assert '"mesh.stopped"' in text
