"""A parse replica SIGKILLed mid-stream costs no request: the gateway opens each of its streams again on the other
replica with what it delivered, and the client's streamed reasoning, text, tool calls (their ids kept) and usage
equal a clean run's (issue 18; ``gateway/parse_client.py``, ``services/parse/continuation.py``).

Real processes (``tests/support/cluster.py``): three NATS nodes, one mocker worker, one router, two parse services and
one gateway dialing ``ipv4:parse-0,parse-1``; OpenAI Chat Completions and OpenAI Responses streams."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.cluster import Cluster, MeshOptions, Sizes, running_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

REASONING = " ".join(f"Step {n}: the forecast for city {n} needs checking, café ☕ 日本語." for n in range(6))
TEXT = " ".join(f"Checking city {n} with its own call." for n in range(6))
COMPLETION = (f"<think>\n{REASONING}\n</think>\n\n{TEXT}\n"
              '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "note": "'
              + " ".join(f"stay {n} dry" for n in range(40)) + '"}}\n</tool_call>\n'
              '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tōkyō", "days": 5}}\n</tool_call>')
TOOLS_CHAT = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                    "note": {"type": "string"}}}}}]
TOOLS_RESPONSES = [{"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "note": {"type": "string"}}}}]
STREAMS = 6  # alternately Chat Completions and Responses, started a little apart: killed at different points


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("parse_resume")
    script = tmp / "script.jsonl"
    script.write_text(json.dumps({"match": "weather plan", "completion": COMPLETION}) + "\n")
    options = MeshOptions(
        worker=("--speedup", "2", "--script", str(script), "--heartbeat-interval", "0.2"),
        parse=("--served-model-name", "demo", "--reasoning-parser", "qwen3", "--tool-parser", "hermes"),
        gateway=("--served-model-name", "demo", "--log-level", "info"),
    )
    with running_cluster(tmp, Sizes(nats=3, workers=1, routers=1, parses=2, gateways=1), options) as running:
        yield running


class Seen:
    """What one streamed turn showed its client, by the API's own events."""

    def __init__(self) -> None:
        self.reasoning: list[str] = []
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = defaultdict(lambda: {"ids": set(), "name": "", "arguments": ""})
        self.finish = ""
        self.usage: dict[str, Any] = {}
        self.deltas = 0

    def phase(self) -> str:
        """Where the stream was: in its reasoning, its text, or its tool calls."""
        return "tool_calls" if self.calls else "text" if "".join(self.text) else "reasoning"

    def result(self) -> dict[str, Any]:
        calls = [(c["name"], c["arguments"], len(c["ids"])) for _, c in sorted(self.calls.items())]
        return {"reasoning": "".join(self.reasoning), "text": "".join(self.text), "calls": calls,
                "finish": self.finish, "usage": self.usage}


async def chat(http: httpx.AsyncClient, base: str, n: int, seen: Seen) -> None:
    body = {"model": "demo", "stream": True, "stream_options": {"include_usage": True}, "tools": TOOLS_CHAT,
            "messages": [{"role": "user", "content": f"Make a weather plan number {n}."}]}
    async with http.stream("POST", base + "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            for choice in chunk.get("choices") or ():
                delta = choice["delta"]
                seen.reasoning.append(delta.get("reasoning_content") or "")
                seen.text.append(delta.get("content") or "")
                for call in delta.get("tool_calls") or ():
                    into = seen.calls[call["index"]]
                    if call.get("id"):
                        into["ids"].add(call["id"])
                    function = call.get("function") or {}
                    into["name"] += function.get("name") or ""
                    into["arguments"] += function.get("arguments") or ""
                seen.finish = choice.get("finish_reason") or seen.finish
                seen.deltas += 1
            if chunk.get("usage"):
                usage = chunk["usage"]
                seen.usage = {"prompt": usage["prompt_tokens"], "completion": usage["completion_tokens"],
                              "reasoning": usage["completion_tokens_details"]["reasoning_tokens"]}


async def responses(http: httpx.AsyncClient, base: str, n: int, seen: Seen) -> None:
    body = {"model": "demo", "stream": True, "tools": TOOLS_RESPONSES, "input": f"Make a weather plan number {n}."}
    async with http.stream("POST", base + "/v1/responses", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            kind = event["type"]
            assert kind != "response.failed", event
            if kind == "response.reasoning_text.delta":
                seen.reasoning.append(event["delta"])
            elif kind == "response.output_text.delta":
                seen.text.append(event["delta"])
            elif kind in ("response.output_item.added", "response.output_item.done"):
                item = event["item"]
                if item["type"] == "function_call":
                    into = seen.calls[event["output_index"]]
                    into["ids"].add(item["call_id"])
                    into["name"] = item["name"]
                    into["arguments"] = item["arguments"] if kind.endswith("done") else into["arguments"]
            elif kind == "response.completed":
                done = event["response"]
                seen.finish = done["status"]
                for index, item in enumerate(done["output"]):
                    if item["type"] == "function_call":
                        seen.calls[index]["ids"].add(item["call_id"])  # the same ids as streamed
                usage = done["usage"]
                seen.usage = {"prompt": usage["input_tokens"], "completion": usage["output_tokens"],
                              "reasoning": usage["output_tokens_details"]["reasoning_tokens"]}
            seen.deltas += kind.endswith(".delta")


async def turn(http: httpx.AsyncClient, base: str, n: int, seen: Seen) -> dict[str, Any]:
    await (chat if n % 2 == 0 else responses)(http, base, n, seen)
    return seen.result()


async def test_streams_of_a_killed_parse_replica_end_as_a_clean_run(cluster: Cluster) -> None:
    base = cluster.procs["gateway-0"].http
    async with httpx.AsyncClient(timeout=60) as http:
        seen = [Seen() for _ in range(STREAMS)]
        streams = []
        for n in range(STREAMS):
            streams.append(asyncio.create_task(turn(http, base, n, seen[n])))
            await asyncio.sleep(0.3)
        for _ in range(300):  # all under way (on parse-0, the gateway's first address), the first in its tool calls
            if (all(s.deltas for s in seen) and seen[0].phase() == "tool_calls") or any(t.done() for t in streams):
                break
            await asyncio.sleep(0.05)
        assert all(s.deltas for s in seen) and not any(t.done() for t in streams), [s.deltas for s in seen]
        at_kill = [f"{s.deltas} deltas, in its {s.phase()}" for s in seen]
        cluster.kill("parse-0")
        resumed = await asyncio.gather(*streams)
        clean = [await turn(http, base, n, Seen()) for n in range(STREAMS)]  # on parse-1, uninterrupted
    print(f"parse-0 killed with {STREAMS} streams on it: {at_kill}")
    log = cluster.procs["gateway-0"].log.read_text()
    assert log.count('"gateway.parse_stream_resumed"') >= STREAMS, log[-3000:]  # every stream moved once
    for n, (got, want) in enumerate(zip(resumed, clean, strict=True)):
        assert got == want, (n, at_kill[n])
        assert [ids for _, _, ids in got["calls"]] == [1, 1], got  # each call kept its one id
        assert got["usage"]["reasoning"] > 0 and got["finish"] in ("tool_calls", "completed")
    assert all(r["usage"]["completion"] == resumed[0]["usage"]["completion"] for r in resumed)
