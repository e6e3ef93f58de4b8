"""A hung worker (SIGSTOP: its sockets stay open, it answers nothing) costs its requests about a second,
not the heartbeat timeout: the router's mux session to it hears no heartbeat within ``LIVENESS`` and fails
its streams, and the router places them on the other worker. The heartbeat timeout is set to 60 s here,
so nothing but the mux liveness can rescue them."""

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


async def test_requests_on_a_hung_worker_are_served_by_the_other_one(tmp_path: Path) -> None:
    args = ["--workers", "2", "--speedup", "50", "--worker-timeout", "60", "--served-model-name", "demo",
            "--router-mode", "round-robin"]
    with running_mesh(args, tmp_path / "mesh.log") as mesh:
        hung, _ = child_pids(mesh.process.pid, "services.worker")
        async with httpx.AsyncClient(timeout=60) as http:

            async def chat(i: int) -> tuple[int, float]:
                body = {"model": "demo", "max_tokens": 8, "messages": [{"role": "user", "content": f"hi {i}"}]}
                started = time.monotonic()
                response = await http.post(mesh.http + "/v1/chat/completions", json=body)
                return response.status_code, time.monotonic() - started

            assert [s for s, _ in await asyncio.gather(*(chat(i) for i in range(4)))] == [200] * 4
            os.kill(hung, signal.SIGSTOP)
            try:
                results = await asyncio.gather(*(chat(100 + i) for i in range(8)))
            finally:
                os.kill(hung, signal.SIGCONT)
        assert [s for s, _ in results] == [200] * 8
        assert max(t for _, t in results) < 20  # seconds: far below the 60 s heartbeat timeout
