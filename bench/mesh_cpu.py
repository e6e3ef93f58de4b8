"""Mesh CPU cost: CPU milliseconds per request in each mesh process, and requests per second.

Starts ``harnessmesh up`` with one mocker worker at a high speedup (engine compute ~0, so what is
left is the mesh's own per-request cost) and drives it through the HTTP edge
(``POST /v1/chat/completions``, streamed) and the gRPC edge (``AgentService.Chat``) at concurrency 1
and 8. For each (edge, concurrency) it reads every child process's CPU time (user + system, from
``/proc``) before and after the run and prints CPU ms per request per process, their sum, and
requests per second. Every request has its own prompt (no prefix-cache hits).

Usage: ``python bench/mesh_cpu.py [--requests 300] [--max-tokens 64] [--log-level warning]
[--edges http,grpc] [--concurrency 1,8]``. Linux only (reads ``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.common.grpc_io import choose_grpc_io

choose_grpc_io()  # the bench's gRPC-edge client uses the services' socket I/O

import grpc  # noqa: E402 - after choose_grpc_io

from services.api import chat_pb2, chat_pb2_grpc, common_pb2  # noqa: E402
from tests.support.mesh import running_mesh  # noqa: E402

_PROCESS_NAMES = ("gateway", "parse", "router", "worker", "nats")


def prompt_text() -> str:
    return f"Request {uuid.uuid4().hex}: " + "please summarise the build log and list every failing test. " * 12


def _name(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    joined = b" ".join(argv).decode(errors="replace")
    for name in _PROCESS_NAMES:
        if name in joined:
            return name
    return str(pid)


def children(pid: int) -> dict[int, str]:
    """Direct children of ``pid`` -> short process name (gateway, parse, router, worker, nats)."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                found[int(entry.name)] = _name(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def http_one(http: httpx.AsyncClient, max_tokens: int) -> None:
    body = {"model": "demo", "messages": [{"role": "user", "content": prompt_text()}], "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for _ in response.aiter_bytes():
            pass


async def grpc_one(stub: chat_pb2_grpc.AgentServiceStub, max_tokens: int) -> None:
    request = chat_pb2.ChatRequest(
        model="demo", messages=[chat_pb2.Message(role="user", parts=[chat_pb2.Part(text=prompt_text())])],
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True),
    )
    async for _ in stub.Chat(request):
        pass


async def run_lanes(one: Callable[[], Awaitable[None]], requests: int, concurrency: int) -> float:
    """Run ``requests`` calls of ``one`` over ``concurrency`` lanes; return the wall seconds."""
    remaining = [requests]

    async def lane() -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            await one()

    t0 = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return time.perf_counter() - t0


async def bench(args: argparse.Namespace, http_url: str, grpc_target: str, kids: dict[int, str]) -> None:
    async with httpx.AsyncClient(base_url=http_url, timeout=120) as http, \
            grpc.aio.insecure_channel(grpc_target) as channel:
        stub = chat_pb2_grpc.AgentServiceStub(channel)
        edges: dict[str, Callable[[], Awaitable[None]]] = {
            "http": lambda: http_one(http, args.max_tokens),
            "grpc": lambda: grpc_one(stub, args.max_tokens),
        }
        order = sorted(set(kids.values()), key=lambda n: _PROCESS_NAMES.index(n) if n in _PROCESS_NAMES else 99)
        print(f"{'edge':<5} {'conc':>4} {'req/s':>7} " + " ".join(f"{n:>8}" for n in order) + f" {'total':>8}"
              "   (CPU ms per request)")
        for edge in args.edges.split(","):
            one = edges[edge]
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                await run_lanes(one, max(args.requests // 10, 2 * concurrency), concurrency)  # warm-up
                before = {pid: cpu_seconds(pid) for pid in kids}
                wall = await run_lanes(one, args.requests, concurrency)
                after = {pid: cpu_seconds(pid) for pid in kids}
                per = {name: 0.0 for name in order}
                for pid, name in kids.items():
                    per[name] += (after[pid] - before[pid]) / args.requests * 1e3
                print(f"{edge:<5} {concurrency:>4} {args.requests / wall:>7.1f} "
                      + " ".join(f"{per[n]:>8.2f}" for n in order) + f" {sum(per.values()):>8.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--speedup", type=float, default=1000.0)
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--edges", default="http,grpc")
    parser.add_argument("--concurrency", default="1,8")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_mesh(
        ["--workers", "1", "--speedup", str(args.speedup), "--served-model-name", "demo",
         "--log-level", args.log_level],
        Path(tmp) / "mesh.log",
    ) as mesh:
        asyncio.run(bench(args, mesh.http, mesh.grpc, children(mesh.process.pid)))


if __name__ == "__main__":
    main()
