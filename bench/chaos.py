"""Faults and overload, measured (issue 13): each scenario on its own ``harnessmesh up``, real processes.

    python bench/chaos.py [--only kill,router,nats,hung,overload] [--requests 60]

* ``kill``: 2 workers, streaming clients; one worker SIGKILLed mid-stream (the supervisor restarts it).
  Failed requests, requests with a wrong token count, the worst gap between two SSE events of a stream.
* ``router``: the router SIGKILLed under 3 clients (restarted; parse retries / resumes). Failed requests.
* ``nats``: nats-server frozen 8 s past a 2 s heartbeat timeout. Failed requests.
* ``hung``: 2 workers, one SIGSTOPped, heartbeat timeout 60 s: TTFT p99 with the hung worker vs healthy.
* ``overload``: 4 slots + 4 queue places, 10x that many concurrent turns (one client process, a connection
  each): admitted TTFT p99 vs unloaded p99 (4 clients, after a warm-up turn each), refused count, median and
  slowest refusal (from the call to the client's reading the status). ``client_floor_ms``: the slowest answer
  the same burst gets from a local server that refuses every request at once, i.e. what the burst costs this
  client and the machine without any gateway; the gateway's share of a refusal is what lies above it.
  Then, with the mesh held saturated by long turns, refusals one at a time on one keep-alive connection
  (``saturated_refusal_*``): how long the gateway takes to refuse, without the burst's client-side queueing.

Targets (the issue's): 0 failed requests everywhere; hung TTFT p99 <= 1.5 s; admitted TTFT p99 under 10x
overload <= 3x unloaded; refusals within 10 ms. Process ids come from ``/proc`` (children of the mesh).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.mesh import RunningMesh, running_mesh
from tests.support.procs import child_pids

MAX_TOKENS = 32


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else (values[0] if values else 0.0)


async def stream_turn(http: httpx.AsyncClient, url: str, i: int) -> dict[str, Any]:
    """One streamed chat turn: status, TTFT, worst gap between events, completion tokens."""
    body = {"model": "demo", "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "messages": [{"role": "user", "content": f"turn {i}"}]}
    started = time.monotonic()
    first = last = None
    gap, tokens, error = 0.0, -1, ""
    try:
        async with http.stream("POST", url + "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                return {"status": response.status_code, "seconds": time.monotonic() - started}
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                now = time.monotonic()
                if last is not None:
                    gap = max(gap, now - last)
                last = now
                event = json.loads(line[6:])
                if "error" in event:
                    error = str(event["error"])
                if first is None and event.get("choices") and event["choices"][0]["delta"].get("content"):
                    first = now
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
    except httpx.HTTPError as exc:
        return {"status": -1, "error": str(exc)}
    ok = not error and tokens == MAX_TOKENS
    return {"status": 200 if ok else 500, "ttft": (first or started) - started, "gap": gap, "tokens": tokens}


async def clients(mesh: RunningMesh, n: int, per: int) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(timeout=60) as http:
        async def one(c: int) -> list[dict[str, Any]]:
            return [await stream_turn(http, mesh.http, c * 1000 + i) for i in range(per)]
        return [r for rs in await asyncio.gather(*(one(c) for c in range(n))) for r in rs]


def failed(results: list[dict[str, Any]]) -> int:
    return sum(1 for r in results if r["status"] != 200)


async def killed_under_load(mesh: RunningMesh, pid: int, clients_n: int, requests: int) -> list[dict[str, Any]]:
    """``clients_n`` streaming clients sharing ``requests`` turns; ``pid`` SIGKILLed 1 s in."""

    async def kill() -> None:
        await asyncio.sleep(1.0)
        os.kill(pid, signal.SIGKILL)

    killer = asyncio.create_task(kill())
    results = await clients(mesh, clients_n, requests // clients_n)
    await killer
    return results


async def scenario_kill(tmp: Path, requests: int) -> dict[str, Any]:
    args = ["--workers", "2", "--speedup", "10", "--heartbeat-interval", "0.2", "--served-model-name", "demo"]
    with running_mesh(args, tmp / "kill.log") as mesh:
        results = await killed_under_load(mesh, child_pids(mesh.process.pid, "services.worker")[0], 4, requests)
    return {"failed": failed(results), "requests": len(results),
            "worst_gap_ms": round(1000 * max(r.get("gap", 0.0) for r in results), 1)}


async def scenario_router(tmp: Path, requests: int) -> dict[str, Any]:
    args = ["--workers", "1", "--speedup", "20", "--heartbeat-interval", "0.2", "--served-model-name", "demo"]
    with running_mesh(args, tmp / "router.log") as mesh:
        results = await killed_under_load(mesh, child_pids(mesh.process.pid, "services.router")[0], 3, requests)
    return {"failed": failed(results), "requests": len(results)}


async def scenario_nats(tmp: Path, requests: int) -> dict[str, Any]:
    args = ["--workers", "2", "--speedup", "20", "--worker-timeout", "2", "--heartbeat-interval", "0.2",
            "--served-model-name", "demo"]
    with running_mesh(args, tmp / "nats.log") as mesh:
        (nats,) = child_pids(mesh.process.pid, "nats-server")
        os.kill(nats, signal.SIGSTOP)
        try:
            results = []
            ends = time.monotonic() + 8
            while time.monotonic() < ends:
                results += await clients(mesh, 2, 1)
        finally:
            os.kill(nats, signal.SIGCONT)
        results += await clients(mesh, 2, 5)
    return {"failed": failed(results), "requests": len(results)}


async def scenario_hung(tmp: Path, requests: int) -> dict[str, Any]:
    args = ["--workers", "2", "--speedup", "20", "--worker-timeout", "60", "--served-model-name", "demo",
            "--router-mode", "round-robin"]
    with running_mesh(args, tmp / "hung.log") as mesh:
        healthy = await clients(mesh, 2, requests // 2)
        hung = child_pids(mesh.process.pid, "services.worker")[0]
        os.kill(hung, signal.SIGSTOP)
        try:
            stalled = await clients(mesh, 2, requests // 2)
        finally:
            os.kill(hung, signal.SIGCONT)
    return {"failed": failed(stalled), "requests": len(stalled),
            "ttft_p99_hung_ms": round(1000 * p99([r["ttft"] for r in stalled if "ttft" in r]), 1),
            "ttft_p99_healthy_ms": round(1000 * p99([r["ttft"] for r in healthy if "ttft" in r]), 1)}


async def refusing_server() -> tuple[asyncio.Server, str]:
    """A server that answers every request with a 429 at once: what the burst costs the client alone."""
    reply = b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"

    class Refuse(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            if b"\r\n\r\n" in data:
                self.transport.write(reply)  # type: ignore[attr-defined]

    server = await asyncio.get_running_loop().create_server(Refuse, "127.0.0.1", 0, backlog=1024)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def long_turn(http: httpx.AsyncClient, url: str, i: int) -> None:
    """A turn that holds its slot until cancelled (thousands of tokens at --speedup 2)."""
    body = {"model": "demo", "max_tokens": 4000, "ignore_eos": True, "stream": True,
            "messages": [{"role": "user", "content": f"long {i}"}]}
    async with http.stream("POST", url + "/v1/chat/completions", json=body) as response:
        async for _ in response.aiter_raw():
            pass


async def saturated_refusals(url: str, probes: int) -> list[float]:
    """Seconds each of ``probes`` sequential turns took to be refused while long turns hold every slot."""
    async with httpx.AsyncClient(timeout=60) as hold, httpx.AsyncClient(timeout=10) as http:
        holders = [asyncio.create_task(long_turn(hold, url, i)) for i in range(8)]
        try:
            await asyncio.sleep(1.0)  # every slot and queue place taken before the first probe
            body = {"model": "demo", "max_tokens": 8, "messages": [{"role": "user", "content": "probe"}]}
            seconds: list[float] = []
            deadline = time.monotonic() + 30
            while len(seconds) < probes and time.monotonic() < deadline:
                started = time.perf_counter()
                response = await http.post(url + "/v1/chat/completions", json=body)
                if response.status_code == 429:  # admitted probes (while the holders settle) are not refusals
                    seconds.append(time.perf_counter() - started)
                else:
                    await asyncio.sleep(0.05)
            return seconds
        finally:
            for task in holders:
                task.cancel()
            await asyncio.gather(*holders, return_exceptions=True)


async def burst_of(url: str, n: int) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(timeout=60) as http:
        return list(await asyncio.gather(*(stream_turn(http, url, i) for i in range(n))))


async def scenario_overload(tmp: Path, requests: int) -> dict[str, Any]:
    args = ["--workers", "1", "--speedup", "2", "--served-model-name", "demo", "--max-concurrent-requests", "4",
            "--max-queued-requests", "4", "--max-queue-wait", "10"]
    with running_mesh(args, tmp / "overload.log") as mesh:
        await clients(mesh, 4, 1)  # warm-up, not measured: the first turns pay one-time imports and connections
        unloaded = await clients(mesh, 4, 5)
        burst = await burst_of(mesh.http, 80)
        await saturated_refusals(mesh.http, 10)  # warm-up of the refusal path on this connection's code
        one_at_a_time = sorted(await saturated_refusals(mesh.http, 60))
    server, url = await refusing_server()
    async with server:
        await burst_of(url, 80)  # warm-up of the client's code paths, as the mesh's unloaded turns were
        floor = await burst_of(url, 80)
    admitted = [r for r in burst if r["status"] == 200]
    refused = [r for r in burst if r["status"] == 429]
    refusal_seconds = sorted(r["seconds"] for r in refused)
    return {"burst": len(burst), "admitted": len(admitted), "refused": len(refused),
            "failed_other": len(burst) - len(admitted) - len(refused),
            "admitted_ttft_p99_ms": round(1000 * p99([r["ttft"] for r in admitted]), 1),
            "unloaded_ttft_p99_ms": round(1000 * p99([r["ttft"] for r in unloaded if "ttft" in r]), 1),
            "median_refusal_ms": round(1000 * statistics.median(refusal_seconds or [0.0]), 1),
            "slowest_refusal_ms": round(1000 * max(refusal_seconds, default=0.0), 1),
            "client_floor_ms": round(1000 * max(r["seconds"] for r in floor), 1),
            "saturated_refusals": len(one_at_a_time),
            "saturated_refusal_p50_ms": round(1000 * statistics.median(one_at_a_time or [0.0]), 2),
            "saturated_refusal_p99_ms": round(1000 * (one_at_a_time[int(0.99 * (len(one_at_a_time) - 1))]
                                                      if one_at_a_time else 0.0), 2),  # nearest rank
            "saturated_refusal_max_ms": round(1000 * max(one_at_a_time, default=0.0), 2)}


SCENARIOS = {"kill": scenario_kill, "router": scenario_router, "nats": scenario_nats, "hung": scenario_hung,
             "overload": scenario_overload}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(SCENARIOS))
    parser.add_argument("--requests", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only.split(","):
            result = await SCENARIOS[name](Path(tmp), args.requests)
            print(f"{name:9s} " + "  ".join(f"{k}={v}" for k, v in result.items()), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
