"""A worker told to stop (SIGTERM: a scale-down, a rolling update) drains: it announces it is leaving,
finishes the streams it has within ``--drain-grace``, refuses new ones, and exits 0. With migration off, so
that nothing but the drain can save them, every stream it held still ends complete, and new requests go to
the other worker. The drained worker is one this test starts beside ``harnessmesh up``'s (as a deployment
runs workers on their own); ``up``'s supervisor treats a child's exit as the mesh's."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.mesh import RunningMesh, running_mesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TOKENS = 120  # at --speedup 4 a decode step is ~3 ms: each stream runs well past the moment of the SIGTERM


async def stream(http: httpx.AsyncClient, mesh: RunningMesh, i: int, started: asyncio.Event) -> tuple[str, int]:
    """A streamed chat; (finish reason, completion tokens) from its last chunks."""
    body = {"model": "demo", "max_tokens": TOKENS, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "messages": [{"role": "user", "content": f"drain {i}"}]}
    finish, tokens = "", -1
    async with http.stream("POST", mesh.http + "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            assert "error" not in chunk, chunk
            started.set()
            for choice in chunk.get("choices") or ():
                finish = choice.get("finish_reason") or finish
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return finish, tokens


async def test_a_stopped_worker_finishes_its_streams_and_takes_no_new_ones(tmp_path: Path) -> None:
    args = ["--workers", "1", "--speedup", "4", "--heartbeat-interval", "0.2", "--migration-limit", "0",
            "--log-level", "info", "--served-model-name", "demo"]
    with running_mesh(args, tmp_path / "mesh.log") as mesh:
        env = {**os.environ, "HARNESSMESH_NATS_TOKEN": mesh.nats_token}
        argv = [sys.executable, "-m", "services.worker", "--nats-url", mesh.nats, "--worker-id", "drained",
                "--speedup", "4", "--heartbeat-interval", "0.2", "--drain-grace", "30", "--log-level", "info"]
        with (tmp_path / "drained.log").open("wb") as out:
            extra = await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            async with httpx.AsyncClient(timeout=60) as http:
                await wait_workers(http, mesh, 2)
                events = [asyncio.Event() for _ in range(6)]
                streams = [asyncio.create_task(stream(http, mesh, i, e)) for i, e in enumerate(events)]
                await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 30)
                extra.send_signal(signal.SIGTERM)  # both workers hold streams (least-loaded placement)
                results = await asyncio.gather(*streams)
                assert results == [("length", TOKENS)] * len(streams)
                assert await asyncio.wait_for(extra.wait(), 30) == 0
                for i in range(6):  # the other worker takes every new request
                    assert await stream(http, mesh, 100 + i, asyncio.Event()) == ("length", TOKENS)
        finally:
            if extra.returncode is None:
                extra.kill()
                await extra.wait()
    log = (tmp_path / "drained.log").read_text()
    assert '"worker.stopped"' in log and '"worker.request_finished"' in log  # it served streams, then stopped


async def wait_workers(http: httpx.AsyncClient, mesh: RunningMesh, count: int) -> None:
    """Until the router lists ``count`` workers (``/v1/models``' owner list is not enough: ask /ready's)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        response = await http.get(mesh.http + "/ready")
        if response.status_code == 200 and response.json().get("workers", 0) >= count:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the router did not list {count} workers: {response.text}")
