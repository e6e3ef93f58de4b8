"""How long the largest requests the gateway accepts hold its event loop (issue 14: ~100 ms at most).

    python bench/loop_stall.py [--messages 10000] [--requests 4] [--path /health]

Starts ``harnessmesh up`` (one mocker worker). For each JSON API that carries a conversation (chat
completions, Messages, Responses) it sends ``--requests`` bodies of ``--messages`` short messages (10,000:
the ``--max-messages`` default) one after another, while a second connection asks the gateway-only
``GET /health`` every 2 ms. The gateway answers /health at once unless its loop is held, so the slowest
/health answer during a large request is the longest the loop was held. ``--path /ready`` asks the parse
service too (its model info and readiness), so it adds parse's loop to the gateway's. Printed per API: each request's
status and slowest /health, in ms, and the ratio of the worst to the slowest /health with no large
request in flight (the baseline, measured first in the same run).

Recorded (2 shared vCPUs; 9,999 messages, ~360 KB, 4 requests per API; each request's slowest /health, ms),
before and after 3dd5f31 (a large body validated and converted in a worker thread, pydantic
validating its messages 256 at a time)::

    before (72c6558): baseline 7.0   chat 159 85 70 66   messages 202 82 85 68   responses 244 78 50 83
                      worst 244 ms = 35.1x the baseline
    after  (3dd5f31): baseline 6.3   chat  30 24 25 21   messages  29 17 28 27   responses  24 18 35 23
                      worst  35 ms =  5.5x the baseline
    793cbf0 (+ the 1 ms GIL switch interval; JSON parsed on the loop again):
                      baseline 6.2   chat  21 20 20 22   messages  21 21 22 25   responses  16 13 19 23
                      worst  25 ms =  4.0x the baseline

With ``--path /ready`` (the gateway's loop and the parse service's), at 1f72db8 and at 7b8752a (the GIL's
switch interval 1 ms instead of 5: ``services/common/runtime.py``)::

    1f72db8: chat 82 83 76 42   messages 85 82 73 68   responses 102 59 57 63   worst 102 ms
    7b8752a: chat 32 52 43 52   messages 43 46 40 42   responses  64 47 46 47   worst  64 ms
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.dynamo_peer.model import build_model_dir
from bench.dynamo_peer.peer import EngineConfig
from bench.vs_dynamo import MODEL, mesh_args
from tests.support.mesh import running_mesh

POLL_INTERVAL = 0.002


def conversation(n: int) -> list[dict[str, str]]:
    """``n`` short messages (one fewer when ``n`` is even), alternating, from a user's to a user's."""
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(n - 1 + n % 2)]


def bodies(n: int) -> dict[str, tuple[str, dict[str, Any], dict[str, str]]]:
    messages = conversation(n)
    return {
        "chat": ("/v1/chat/completions", {"model": MODEL, "max_tokens": 1, "messages": messages}, {}),
        "messages": ("/v1/messages", {"model": MODEL, "max_tokens": 1, "messages": messages},
                     {"anthropic-version": "2023-06-01"}),
        "responses": ("/v1/responses", {"model": MODEL, "max_output_tokens": 1,
                                        "input": [{"role": "user", "content": m["content"]} for m in messages]}, {}),
    }


async def slowest_health(small: httpx.AsyncClient, path: str, during: asyncio.Future[Any]) -> float:
    """The slowest answer to ``GET path`` (seconds) while ``during`` runs."""
    slowest = 0.0
    while not during.done():
        start = time.perf_counter()
        await small.get(path)
        slowest = max(slowest, time.perf_counter() - start)
        await asyncio.sleep(POLL_INTERVAL)
    return slowest


async def measure(url: str, args: argparse.Namespace) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=300) as big, \
            httpx.AsyncClient(base_url=url, timeout=60) as small:
        await small.get(args.path)  # the connection's set-up is not the loop's
        idle = asyncio.ensure_future(asyncio.sleep(1.0))
        baseline = await slowest_health(small, args.path, idle)
        print(f"baseline (no large request): slowest {args.path} {baseline * 1e3:.1f} ms")
        worst_all = 0.0
        for name, (path, body, headers) in bodies(args.messages).items():
            content = orjson.dumps(body)
            cells = []
            for _ in range(args.requests):
                post = asyncio.ensure_future(big.post(path, content=content,
                                                      headers={"content-type": "application/json", **headers}))
                slowest = await slowest_health(small, args.path, post)
                worst_all = max(worst_all, slowest)
                response = post.result()
                if response.status_code != 200 and not cells:
                    print(f"{name}: HTTP {response.status_code} {response.text[:300]}")
                cells.append(f"{response.status_code}:{slowest * 1e3:.0f}")
            print(f"{name:<10} {len(content):>9,} B   " + "  ".join(cells))
        print(f"worst {worst_all * 1e3:.0f} ms = {worst_all / baseline:.1f}x the baseline")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--path", default="/health", help="what to ask meanwhile: /health (the gateway's loop), "
                        "/ready (and the parse service's)")
    args = parser.parse_args()
    cfg = EngineConfig()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model_dir(Path(tmp) / "model", cfg.context)
        with running_mesh(mesh_args(model, cfg), Path(tmp) / "mesh.log") as mesh:
            asyncio.run(measure(mesh.http, args))


if __name__ == "__main__":
    main()
