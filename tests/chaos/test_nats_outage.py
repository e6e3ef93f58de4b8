"""NATS carries KV events and discovery, not liveness: with the nats-server frozen for 8 s (SIGSTOP, past
the 2 s heartbeat timeout used here) the router keeps every worker that answers gRPC health, and no
request fails during the outage or after it."""

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

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


async def test_an_8_s_nats_outage_fails_no_request(tmp_path: Path) -> None:
    args = ["--workers", "2", "--speedup", "50", "--worker-timeout", "2", "--heartbeat-interval", "0.2",
            "--served-model-name", "demo", "--log-level", "info"]
    with running_mesh(args, tmp_path / "mesh.log") as mesh:
        (nats,) = child_pids(mesh.process.pid, "nats-server")
        async with httpx.AsyncClient(timeout=30) as http:

            async def chat(i: int) -> tuple[int, str]:
                body = {"model": "demo", "max_tokens": 8, "ignore_eos": True,
                        "messages": [{"role": "user", "content": f"hello {i}"}]}
                response = await http.post(mesh.http + "/v1/chat/completions", json=body)
                ok = response.status_code == 200
                return response.status_code, response.json()["choices"][0]["message"]["content"] if ok else ""

            statuses: list[tuple[int, str]] = []
            os.kill(nats, signal.SIGSTOP)
            try:
                outage_ends = time.monotonic() + 8
                while time.monotonic() < outage_ends:
                    statuses.extend(await asyncio.gather(*(chat(len(statuses) + i) for i in range(2))))
                    await asyncio.sleep(0.2)
                ready = await http.get(mesh.http + "/ready")
            finally:
                os.kill(nats, signal.SIGCONT)
            assert ready.status_code == 200 and ready.json()["workers"] == 2  # both still routable
            for _ in range(10):  # and after it
                statuses.append(await chat(len(statuses)))
            clean = [await chat(i) for i in range(len(statuses))]
        assert len(statuses) > 20 and [s for s, _ in statuses] == [200] * len(statuses), statuses
        assert statuses == clean  # each answer exactly a clean run's
    assert '"router.worker_kept"' in (tmp_path / "mesh.log").read_text()
