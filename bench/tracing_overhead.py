"""Tracing overhead: request latency with the OTLP collector down vs. no exporter at all.

Starts two meshes side by side in one run (mocker engine at high speedup, so the mesh's own work
dominates): ``off`` with ``OTEL_TRACES_EXPORTER=none`` and ``down`` exporting every span over OTLP/gRPC
to a port where nothing listens (what happens when Jaeger is down). Requests alternate between the
two meshes so drift hits both alike; each request has its own prompt. Prints median and p90 TTFT
and end-to-end latency of each, and the ratio ``down / off`` (1.00 = unchanged).

Usage: ``python bench/tracing_overhead.py [--requests 60] [--max-tokens 32] [--speedup 1000]``.
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
from contextlib import ExitStack
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.mesh import running_mesh
from tests.support.nats import free_port


async def one(http: httpx.AsyncClient, max_tokens: int) -> tuple[float, float]:
    body = {"model": "demo", "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"Request {uuid.uuid4().hex}: summarise the build log. " * 8}]}
    t0 = time.perf_counter()
    ttft = 0.0
    async with http.stream("POST", "/v1/chat/completions", json=body,
                           headers={"x-session-id": "bench-" + uuid.uuid4().hex[:8]}) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not ttft and line.startswith("data: {") and '"content"' in line:
                ttft = time.perf_counter() - t0
    return ttft, time.perf_counter() - t0


def summary(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.9) - 1] * 1000


async def run(urls: dict[str, str], requests: int, max_tokens: int) -> dict[str, dict[str, float]]:
    clients = {name: httpx.AsyncClient(base_url=url, timeout=60) for name, url in urls.items()}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in urls}
    try:
        for http in clients.values():  # warm-up
            for _ in range(3):
                await one(http, max_tokens)
        for i in range(requests):
            for name in (list(clients) if i % 2 == 0 else list(reversed(clients))):
                results[name].append(await one(clients[name], max_tokens))
    finally:
        for http in clients.values():
            await http.aclose()
    out = {}
    for name, samples in results.items():
        ttft50, ttft90 = summary([s[0] for s in samples])
        e2e50, e2e90 = summary([s[1] for s in samples])
        out[name] = {"ttft_p50_ms": ttft50, "ttft_p90_ms": ttft90, "e2e_p50_ms": e2e50, "e2e_p90_ms": e2e90}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=60, help="requests per mesh (default 60)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--speedup", type=float, default=1000.0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    ns = parser.parse_args()
    args = ["--workers", "1", "--speedup", str(ns.speedup), "--served-model-name", "demo"]
    envs = {
        "off": {"OTEL_TRACES_EXPORTER": "none"},
        "down": {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",
                 "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TIMEOUT": "1"},
    }
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        urls = {name: stack.enter_context(running_mesh(args, Path(tmp) / f"{name}.log", env=env)).http
                for name, env in envs.items()}
        result = asyncio.run(run(urls, ns.requests, ns.max_tokens))
    ratio = {key: round(result["down"][key] / result["off"][key], 3) for key in result["off"]}
    if ns.json:
        print(json.dumps({"off": result["off"], "down": result["down"], "ratio_down_over_off": ratio}))
        return
    print(f"{'':6} {'TTFT p50':>10} {'TTFT p90':>10} {'e2e p50':>10} {'e2e p90':>10}   "
          f"(ms, {ns.requests} requests each)")
    for name in ("off", "down"):
        r = result[name]
        print(f"{name:6} {r['ttft_p50_ms']:10.2f} {r['ttft_p90_ms']:10.2f} {r['e2e_p50_ms']:10.2f} "
              f"{r['e2e_p90_ms']:10.2f}")
    print(f"{'ratio':6} {ratio['ttft_p50_ms']:10.3f} {ratio['ttft_p90_ms']:10.3f} {ratio['e2e_p50_ms']:10.3f} "
          f"{ratio['e2e_p90_ms']:10.3f}   (collector down / no exporter)")


if __name__ == "__main__":
    main()
