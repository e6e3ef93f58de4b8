"""Mesh overhead: TTFT and inter-token latency through the whole mesh vs. one worker's stream directly.

Runs, side by side in one process and one mesh (mocker engine at high speedup so the engine's own
time is small and the mesh's overhead shows):

* ``direct``: ``Worker.Generate`` on one worker's gRPC port with the prompt's token ids;
* ``mesh-http``: ``POST /v1/chat/completions`` (stream) through gateway -> parse -> router -> worker;
* ``mesh-grpc``: ``AgentService.Chat`` on the gateway's gRPC edge, same path behind it.

at concurrency 1 and 8, and prints each path's median TTFT / ITL and the ratio to ``direct``.
Every request has its own prompt (no prefix-cache hits on any path), with the same length on every
path. Usage: ``python bench/mesh_overhead.py [--requests 40] [--max-tokens 64] [--speedup 1000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.common.grpc_io import choose_grpc_io

choose_grpc_io()  # the bench's own gRPC clients (``direct``, ``mesh-grpc``) use the services' socket I/O

import grpc  # noqa: E402 - after choose_grpc_io

from services.api import chat_pb2, chat_pb2_grpc, worker_pb2, worker_pb2_grpc  # noqa: E402
from services.common import token_bytes  # noqa: E402
from tests.support.mesh import running_mesh  # noqa: E402

Sample = tuple[float, float]  # (ttft seconds, mean inter-token seconds)


def prompt_text() -> str:
    return f"Request {uuid.uuid4().hex}: " + "please summarise the build log and list every failing test. " * 12


def messages() -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt_text()}]


def timing(t0: float, stamps: list[tuple[float, int]]) -> Sample:
    tokens = sum(n for _, n in stamps)
    ttft = stamps[0][0] - t0
    itl = (stamps[-1][0] - stamps[0][0]) / max(tokens - 1, 1)
    return ttft, itl


async def direct_one(stub: worker_pb2_grpc.WorkerStub, http: httpx.AsyncClient, max_tokens: int) -> Sample:
    tokens = (await http.post("/tokenize", json={"model": "demo", "messages": messages()})).json()["tokens"]
    request = worker_pb2.GenerateRequest(request_id=uuid.uuid4().hex, token_ids_u32=token_bytes.pack(tokens),
                                         sampling={"max_tokens": max_tokens, "ignore_eos": True})
    t0 = time.perf_counter()
    stamps = [(time.perf_counter(), len(frame.token_ids)) async for frame in stub.Generate(request)
              if frame.token_ids]
    return timing(t0, stamps)


async def http_one(http: httpx.AsyncClient, max_tokens: int) -> Sample:
    body = {"model": "demo", "messages": messages(), "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    stamps: list[tuple[float, int]] = []
    last_completion = 0
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and (chunk["choices"][0]["delta"].get("content")):
                stamps.append((time.perf_counter(), 1))
            if chunk.get("usage"):
                last_completion = chunk["usage"]["completion_tokens"]
    # One SSE chunk may carry several tokens: spread the count over the chunks seen.
    if stamps and last_completion:
        stamps = [(t, 0) for t, _ in stamps]
        stamps[0] = (stamps[0][0], 1)
        stamps[-1] = (stamps[-1][0], max(last_completion - 1, 1)) if len(stamps) > 1 else stamps[0]
    return timing(t0, stamps)


async def grpc_one(stub: chat_pb2_grpc.AgentServiceStub, max_tokens: int) -> Sample:
    request = chat_pb2.ChatRequest(
        model="demo",
        messages=[chat_pb2.Message(role="user", parts=[chat_pb2.Part(text=prompt_text())])],
        sampling={"max_tokens": max_tokens, "ignore_eos": True},
    )
    t0 = time.perf_counter()
    stamps: list[tuple[float, int]] = []
    completion = 0
    async for batch in stub.Chat(request):
        now = time.perf_counter()
        for event in batch.events:
            kind = event.WhichOneof("event")
            if kind == "text_delta":
                stamps.append((now, 0))
            elif kind == "usage":
                completion = event.usage.completion_tokens
    if stamps:
        stamps[0] = (stamps[0][0], 1)
        if len(stamps) > 1:
            stamps[-1] = (stamps[-1][0], max(completion - 1, 1))
    return timing(t0, stamps)


async def run_path(one: Callable[[], Awaitable[Sample]], requests: int, concurrency: int) -> list[Sample]:
    queue = list(range(requests))
    samples: list[Sample] = []

    async def lane() -> None:
        while queue:
            queue.pop()
            samples.append(await one())

    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return samples


def median(samples: list[Sample], i: int) -> float:
    return statistics.median(s[i] for s in samples)


async def bench(args: argparse.Namespace, http_url: str, grpc_target: str, worker: str) -> None:
    async with httpx.AsyncClient(base_url=http_url, timeout=120) as http, \
            grpc.aio.insecure_channel(worker) as wch, grpc.aio.insecure_channel(grpc_target) as gch:
        worker_stub = worker_pb2_grpc.WorkerStub(wch)
        agent_stub = chat_pb2_grpc.AgentServiceStub(gch)
        paths: dict[str, Callable[[], Awaitable[Sample]]] = {
            "direct": lambda: direct_one(worker_stub, http, args.max_tokens),
            "mesh-http": lambda: http_one(http, args.max_tokens),
            "mesh-grpc": lambda: grpc_one(agent_stub, args.max_tokens),
        }
        await run_path(paths["mesh-http"], 4, 2)  # warm-up
        print(f"{'conc':>4} {'path':<10} {'TTFT ms':>9} {'ITL ms':>8} {'TTFT x':>7} {'ITL x':>7}")
        for concurrency in (1, 8):
            results = {}
            for name, one in paths.items():
                results[name] = await run_path(one, args.requests, concurrency)
            base_ttft, base_itl = median(results["direct"], 0), median(results["direct"], 1)
            for name, samples in results.items():
                ttft, itl = median(samples, 0), median(samples, 1)
                print(f"{concurrency:>4} {name:<10} {ttft * 1e3:>9.2f} {itl * 1e3:>8.3f} "
                      f"{ttft / base_ttft:>7.2f} {itl / base_itl:>7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--speedup", type=float, default=1000.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_mesh(
        ["--workers", "1", "--speedup", str(args.speedup), "--served-model-name", "demo", "--log-level", "warning"],
        Path(tmp) / "mesh.log",
    ) as mesh:
        asyncio.run(bench(args, mesh.http, mesh.grpc, mesh.workers[0]))


if __name__ == "__main__":
    main()
