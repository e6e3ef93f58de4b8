"""The one client of every stack: OpenAI chat completions, streamed (SSE), over httpx on loopback."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class Result:
    """One streamed request: seconds to the first content byte and to the end; usage as reported."""

    ttft: float
    e2e: float
    prompt_tokens: int
    completion_tokens: int


class StreamError(RuntimeError):
    pass


async def stream_chat(http: httpx.AsyncClient, body: dict[str, Any]) -> Result:
    """POST ``body`` to ``/v1/chat/completions`` and read the stream to ``[DONE]``.

    The body is encoded before the clock starts (as httpx's ``json=`` would encode it): the client's own JSON
    encoding is no part of serving, and at ~100k prompt tokens it was ~1.3 ms of every stack's time to first
    token (the null server's "serving time" at 100k was twice its time at 4k)."""
    content = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    t0 = time.perf_counter()
    ttft = -1.0
    usage: dict[str, int] = {}
    async with http.stream("POST", "/v1/chat/completions", content=content, headers=headers) as response:
        if response.status_code != 200:
            raise StreamError(f"HTTP {response.status_code}: {(await response.aread())[:500]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise StreamError(f"in-band error: {chunk['error']}")
            if ttft < 0:
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
                        ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                usage = chunk["usage"]
    e2e = time.perf_counter() - t0
    if ttft < 0:
        raise StreamError(f"no content in the stream (usage {usage})")
    return Result(ttft, e2e, int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)))


async def run_concurrent(one: Callable[[], Awaitable[Result]], requests: int, concurrency: int
                         ) -> tuple[list[Result], float]:
    """``requests`` calls of ``one`` over ``concurrency`` lanes; returns results and the wall seconds."""
    left = [requests]
    results: list[Result] = []

    async def lane() -> None:
        while left[0] > 0:
            left[0] -= 1
            results.append(await one())

    t0 = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return results, time.perf_counter() - t0


def client(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(300.0),
                             limits=httpx.Limits(max_connections=32, max_keepalive_connections=32))
