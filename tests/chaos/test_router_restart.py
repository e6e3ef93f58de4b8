"""A router killed and restarted under load loses no request: the supervisor starts it again and the
parse service retries a router stream that fails before its first token (``--router-retry``) and resumes
one that fails after it; every answer is exactly a clean run's."""

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

MAX_TOKENS = 24


async def chat(http: httpx.AsyncClient, url: str, i: int) -> tuple[int, int, str]:
    """(status, completion tokens, text): ``ignore_eos`` so every served request has exactly MAX_TOKENS."""
    body = {"model": "demo", "max_tokens": MAX_TOKENS, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"hello {i}"}]}
    response = await http.post(url + "/v1/chat/completions", json=body)
    if response.status_code != 200:
        return response.status_code, -1, ""
    reply = response.json()
    return 200, reply["usage"]["completion_tokens"], reply["choices"][0]["message"]["content"]


async def test_a_killed_router_is_restarted_and_no_request_fails(tmp_path: Path) -> None:
    args = ["--workers", "1", "--speedup", "50", "--heartbeat-interval", "0.2", "--served-model-name", "demo"]
    with running_mesh(args, tmp_path / "mesh.log") as mesh:
        (router,) = child_pids(mesh.process.pid, "services.router")
        async with httpx.AsyncClient(timeout=30) as http:

            async def client(n: int) -> list[tuple[int, int, str]]:
                return [await chat(http, mesh.http, n * 1000 + i) for i in range(40)]

            async def kill_soon() -> None:
                await asyncio.sleep(0.5)
                os.kill(router, signal.SIGKILL)

            started = time.monotonic()
            killer = asyncio.create_task(kill_soon())
            results = await asyncio.gather(*(client(n) for n in range(3)))
            await killer
            elapsed = time.monotonic() - started
            clean = [await chat(http, mesh.http, n * 1000 + i) for n in range(3) for i in range(40)]
        served = [s for r in results for s in r]
        assert [s[:2] for s in served] == [(200, MAX_TOKENS)] * len(served), served  # none failed, lost or doubled
        assert served == clean  # each text exactly a clean run's
        restarted = child_pids(mesh.process.pid, "services.router")
        assert restarted and restarted != [router] and mesh.process.poll() is None
        assert elapsed > 1.0  # the outage happened while the clients were sending
