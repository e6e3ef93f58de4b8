"""``--max-request-bytes`` on the real mesh: a 50 MB body (declared, or streamed chunked) gets 413 quickly and
no process of the mesh grows by more than a small part of it (issue 14: the parse service never sees it)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.support.mesh import running_mesh
from tests.support.procs import child_pids

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

BIG = 50 * 1024 * 1024


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


async def chunks(total: int, size: int = 1 << 20) -> AsyncIterator[bytes]:
    yield b'{"model": "demo", "messages": [{"role": "user", "content": "'
    for _ in range(total // size):
        yield b"x" * size
    yield b'"}]}'


async def test_a_50_mb_body_is_413_quickly_and_grows_no_process(tmp_path: Path) -> None:
    args = ["--workers", "1", "--speedup", "1000", "--max-request-bytes", str(1 << 20), "--served-model-name",
            "demo", "--log-level", "warning"]
    with running_mesh(args, tmp_path / "mesh.log") as mesh:
        pids = {name: child_pids(mesh.process.pid, name)[0] for name in ("gateway", "services.parse")}
        async with httpx.AsyncClient(base_url=mesh.http, timeout=60) as http:
            hello = {"model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
            assert (await http.post("/v1/chat/completions", json=hello)).status_code == 200  # warm: imports done
            before = {name: rss_mb(pid) for name, pid in pids.items()}
            body = b'{"model": "demo", "messages": [{"role": "user", "content": "' + b"x" * BIG + b'"}]}'
            started = time.monotonic()
            declared = await http.post("/v1/chat/completions", content=body,
                                       headers={"content-type": "application/json"})
            assert declared.status_code == 413 and declared.json()["error"]["param"] == "body"
            streamed = await http.post("/v1/chat/completions", content=chunks(BIG),
                                       headers={"content-type": "application/json"})
            assert streamed.status_code == 413
            assert time.monotonic() - started < 20
            grown = {name: rss_mb(pid) - before[name] for name, pid in pids.items()}
            assert (await http.post("/v1/chat/completions", json=hello)).status_code == 200  # the mesh still serves
        assert grown["services.parse"] < 2, grown  # the body never reached it
        assert grown["gateway"] < 10, grown  # a few buffered chunks at most, never the 50 MB
