"""Supervision under ``harnessmesh up``: a SIGKILLed worker is started again while the rest keep serving
(issue 13's first row; ``--restart never`` is tests/launcher/test_up.py's)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.support.mesh import RunningMesh, running_mesh
from tests.support.procs import child_pids

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


async def chat(http: httpx.AsyncClient, mesh: RunningMesh, i: int) -> int:
    body = {"model": "demo", "max_tokens": 8, "messages": [{"role": "user", "content": f"hello {i}"}]}
    return (await http.post(mesh.http + "/v1/chat/completions", json=body)).status_code


async def test_a_killed_worker_is_restarted_and_the_mesh_keeps_serving(tmp_path: Path) -> None:
    args = ["--workers", "2", "--speedup", "50", "--heartbeat-interval", "0.2", "--log-level", "info",
            "--served-model-name", "demo"]
    with running_mesh(args, tmp_path / "mesh.log") as mesh:
        workers = child_pids(mesh.process.pid, "services.worker")
        assert len(workers) == 2
        async with httpx.AsyncClient(timeout=30) as http:
            assert await chat(http, mesh, 0) == 200
            os.kill(workers[0], signal.SIGKILL)
            statuses = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                statuses.append(await chat(http, mesh, len(statuses)))
                restarted = [p for p in child_pids(mesh.process.pid, "services.worker") if p not in workers]
                if restarted and len(statuses) >= 10:
                    break
                await asyncio.sleep(0.1)
            assert restarted, "the killed worker was not started again"
            assert mesh.process.poll() is None  # the launcher kept running
            assert statuses.count(200) == len(statuses), statuses  # the other worker served throughout
            for i in range(20):  # the restarted worker comes back into the rotation
                assert await chat(http, mesh, 100 + i) == 200
    log = (tmp_path / "mesh.log").read_text()
    assert '"mesh.child_restarted"' in log and '"previous_status": -9' in log
