"""``harnessmesh up`` as a user runs it: clean stop on SIGTERM, non-zero exit when a child dies."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.support.mesh import running_mesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def child_pids(log: Path) -> dict[str, int]:
    pids = {}
    for line in log.read_text().splitlines():
        if line.startswith("{") and '"mesh.child_started"' in line:
            event = json.loads(line)
            pids[event["name"]] = event["pid"]
    return pids


def test_with_restart_never_a_dying_child_stops_the_mesh_with_nonzero_status(tmp_path: Path) -> None:
    log = tmp_path / "mesh.log"
    with running_mesh(["--workers", "1", "--speedup", "100", "--restart", "never"], log) as mesh:
        pids = child_pids(log)
        assert set(pids) == {"router", "worker-0", "parse", "gateway"}
        os.kill(pids["worker-0"], signal.SIGKILL)
        assert mesh.process.wait(30) == 1
    assert '"mesh.child_exited"' in log.read_text()
    for pid in pids.values():  # every other child was stopped too
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_sigterm_stops_everything_cleanly(tmp_path: Path) -> None:
    log = tmp_path / "mesh.log"
    with running_mesh(["--workers", "1", "--speedup", "100"], log) as mesh:
        pids = child_pids(log)
        mesh.process.send_signal(signal.SIGTERM)
        assert mesh.process.wait(30) == 0
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert '"mesh.stopped"' in log.read_text()
