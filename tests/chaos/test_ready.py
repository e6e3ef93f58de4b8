"""``/ready`` follows routability: 503 with the reason while no worker is routable (its only worker is
hung, SIGSTOPped, past the heartbeat timeout), 200 again once it is back; ``/health`` stays 200."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.support.mesh import running_mesh
from tests.support.procs import child_pids

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


async def wait_status(http: httpx.AsyncClient, url: str, status: int, within: float) -> httpx.Response:
    deadline = time.monotonic() + within
    while True:
        response = await http.get(url)
        if response.status_code == status or time.monotonic() > deadline:
            return response
        await asyncio.sleep(0.1)


async def test_ready_is_503_while_no_worker_is_routable(tmp_path: Path) -> None:
    args = ["--workers", "1", "--worker-timeout", "1", "--heartbeat-interval", "0.2"]
    with running_mesh(args, tmp_path / "mesh.log") as mesh:
        (worker,) = child_pids(mesh.process.pid, "services.worker")
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(mesh.http + "/ready")).status_code == 200
            os.kill(worker, signal.SIGSTOP)
            try:
                hung = await wait_status(http, mesh.http + "/ready", 503, within=10)
                assert hung.status_code == 503 and "no worker is routable" in hung.json()["error"]["message"]
                assert (await http.get(mesh.http + "/health")).status_code == 200
            finally:
                os.kill(worker, signal.SIGCONT)
            back = await wait_status(http, mesh.http + "/ready", 200, within=10)
            assert back.status_code == 200 and back.json()["workers"] == 1
