"""TTFT of a long Claude Code-shaped second turn with the billing-header strip on vs. off, on one mesh.

Claude Code puts ``x-anthropic-billing-header: cc_version=...; cc_entrypoint=...; cch=...;`` in
``system[0]``, the first line of the prompt. When the line changes between requests (``cch`` is a
per-request hash; ``cc_version`` differs per session) every token after it is a prefix-cache miss.
This bench replays the captured Claude Code request (``tests/fixtures/captures``), padded with a
project-notes reminder to >= 30k prompt tokens, as sessions of two turns whose header differs in
``cch``. Each session runs with the strip on or off per request
(``x-harnessmesh-strip-anthropic-preamble``), alternating, on the same mesh (mocker timing model), and
the bench prints the median TTFT of the second turn for each and the ratio off / on.

Usage: ``python bench/anthropic_strip.py [--sessions 4] [--speedup 4]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.fixtures import CAPTURES  # noqa: E402
from tests.support.mesh import running_mesh  # noqa: E402

CAPTURE = CAPTURES / "claude-code_2.1.330_tool-loop_requests.json"
STRIP_HEADER = "x-harnessmesh-strip-anthropic-preamble"
NOTES = "Project notes: the build uses make; tests live in tests/; run them with pytest before committing. "


def first_request(padding: int) -> tuple[dict[str, Any], dict[str, str]]:
    captured = json.loads(CAPTURE.read_text())["requests"][0]
    body = copy.deepcopy(captured["body"])
    body.update(model="demo", max_tokens=32, stream=True)
    body["messages"][0]["content"].insert(0, {"type": "text", "text": "<system-reminder>\n" + NOTES * padding +
                                              "\n</system-reminder>\n"})
    headers = {k: v for k, v in captured["headers"].items()
               if k.lower() not in ("host", "content-length", "accept-encoding", "connection")}
    return body, headers


async def turn(http: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str]) -> tuple[float, list[Any]]:
    """Send one streaming turn; return its TTFT and the assistant content blocks."""
    t0 = time.perf_counter()
    ttft = 0.0
    blocks: list[dict[str, Any]] = []
    async with http.stream("POST", "/v1/messages?beta=true", json=body, headers=headers) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:300]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "content_block_delta" and not ttft:
                ttft = time.perf_counter() - t0
            if event["type"] == "content_block_start":
                blocks.append(event["content_block"])
            elif event["type"] == "content_block_delta" and event["delta"]["type"] == "text_delta":
                blocks[event["index"]]["text"] += event["delta"]["text"]
            elif event["type"] == "content_block_delta" and event["delta"]["type"] == "thinking_delta":
                blocks[event["index"]]["thinking"] += event["delta"]["thinking"]
            elif event["type"] == "content_block_delta" and event["delta"]["type"] == "signature_delta":
                blocks[event["index"]]["signature"] = event["delta"]["signature"]
    return ttft, blocks


async def session(http: httpx.AsyncClient, strip: bool, padding: int) -> tuple[float, int]:
    body, headers = first_request(padding)
    headers = {**headers, STRIP_HEADER: "1" if strip else "0", "X-Claude-Code-Session-Id": str(uuid.uuid4())}
    body["messages"][0]["content"][-1]["text"] = f"Task {uuid.uuid4().hex}: summarise the repository."
    billing = body["system"][0]
    billing["text"] = billing["text"].rstrip() + f" cch={uuid.uuid4().hex[:5]};"
    _, blocks = await turn(http, body, headers)
    body["messages"] += [{"role": "assistant", "content": blocks},
                         {"role": "user", "content": [{"type": "text", "text": "Now list the open issues."}]}]
    billing["text"] = billing["text"].rsplit(" cch=", 1)[0] + f" cch={uuid.uuid4().hex[:5]};"
    count = (await http.post("/v1/messages/count_tokens?beta=true", headers=headers, json={
        k: body[k] for k in ("model", "messages", "system", "tools", "thinking")})).json()["input_tokens"]
    ttft, _ = await turn(http, body, headers)
    return ttft, count


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "script.jsonl"
        script.write_text(json.dumps({"match": "", "completion": "<think>\nLooking.\n</think>\n\nDone."}) + "\n")
        mesh_args = ["--workers", "1", "--speedup", str(args.speedup), "--script", str(script),
                     "--reasoning-parser", "qwen3", "--tool-parser", "hermes", "--served-model-name", "demo",
                     "--block-size", "16"]
        with running_mesh(mesh_args, Path(tmp) / "mesh.log") as mesh:
            async with httpx.AsyncClient(base_url=mesh.http, timeout=300) as http:
                await session(http, True, args.padding)  # warm-up: the shared system prompt and tools
                results: dict[bool, list[float]] = {True: [], False: []}
                tokens = 0
                for i in range(args.sessions * 2):
                    strip = i % 2 == 0
                    ttft, tokens = await session(http, strip, args.padding)
                    results[strip].append(ttft)
    on, off = statistics.median(results[True]), statistics.median(results[False])
    print(f"second-turn prompt: {tokens} tokens; mocker speedup {args.speedup}; {args.sessions} sessions each")
    print(f"strip on : median TTFT {on * 1000:8.1f} ms  {[round(t * 1000) for t in results[True]]}")
    print(f"strip off: median TTFT {off * 1000:8.1f} ms  {[round(t * 1000) for t in results[False]]}")
    print(f"ratio off/on: {off / on:.1f}x")


if __name__ == "__main__":
    import asyncio

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--speedup", type=float, default=4.0)
    parser.add_argument("--padding", type=int, default=80, help="repeats of the project-notes line (prompt length)")
    asyncio.run(main(parser.parse_args()))
