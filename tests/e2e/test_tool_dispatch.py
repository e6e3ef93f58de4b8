"""Through the real mesh (mocker --script): reasoning and tool calls stream in order, and each call's
``tool_call_dispatch`` event arrives as soon as its arguments close — before the turn ends."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import WEATHER_TOOL
from tests.support.mesh import RunningMesh, running_mesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

INTERLEAVED = (
    "<think>\nParis first.\n</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    "<think>\nNow Lyon, in \"celsius\".\n</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon", "unit": "celsius"}}\n</tool_call>'
)
MESSAGES: list[Any] = [{"role": "user", "content": "Weather in Paris and Lyon, please."}]


@pytest.fixture(scope="module")
def dispatch_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningMesh]:
    tmp = tmp_path_factory.mktemp("dispatch_mesh")
    script = tmp / "script.jsonl"
    script.write_text(json.dumps({"match": "Paris and Lyon", "completion": INTERLEAVED}) + "\n")
    args = ["--workers", "1", "--speedup", "20", "--script", str(script), "--reasoning-parser", "qwen3",
            "--tool-parser", "hermes", "--served-model-name", "demo", "--enable-streaming-tool-dispatch",
            "--template-now", "2026-01-15T09:30:00"]
    with running_mesh(args, Path(tmp) / "mesh.log") as mesh:
        yield mesh


async def test_reasoning_and_calls_in_order_with_dispatch_before_the_end(dispatch_mesh: RunningMesh) -> None:
    body = {"model": "demo", "messages": MESSAGES, "tools": [WEATHER_TOOL], "stream": True}
    order: list[str] = []
    dispatched: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=60) as http, http.stream(
        "POST", dispatch_mesh.http + "/v1/chat/completions", json=body
    ) as response:
        event = None
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                event = line[len("event: "):]
            elif line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[len("data: "):])
                if event == "tool_call_dispatch":
                    assert chunk["choices"] == [] and chunk["object"] == "chat.completion.chunk"
                    dispatched.append(chunk["tool_call_dispatch"]["tool_call"])
                    order.append("dispatch")
                for choice in chunk["choices"]:
                    delta = choice["delta"]
                    order += [k for k in ("reasoning_content", "content", "tool_calls") if delta.get(k)]
                    if choice["finish_reason"]:
                        order.append("finish:" + choice["finish_reason"])
                event = None
    runs = [k for i, k in enumerate(order) if i == 0 or k != order[i - 1]]
    assert runs == ["reasoning_content", "tool_calls", "dispatch", "reasoning_content", "tool_calls", "dispatch",
                    "finish:tool_calls"]
    assert [(d["function"]["name"], json.loads(d["function"]["arguments"])) for d in dispatched] == [
        ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Lyon", "unit": "celsius"})]
    assert all(d["id"].startswith("call_") for d in dispatched)


async def test_the_openai_sdk_reads_the_same_stream(dispatch_mesh: RunningMesh) -> None:
    api = openai.AsyncOpenAI(base_url=dispatch_mesh.http + "/v1", api_key="sk-test", max_retries=0)
    tools: Any = [WEATHER_TOOL]
    stream = await api.chat.completions.create(model="demo", messages=MESSAGES, tools=tools, stream=True)
    reasoning, dispatches = "", 0
    args: dict[int, str] = {}
    async for chunk in stream:
        dispatches += "tool_call_dispatch" in (chunk.model_extra or {})
        for choice in chunk.choices:
            delta: Any = choice.delta
            reasoning += getattr(delta, "reasoning_content", None) or ""
            for call in delta.tool_calls or []:
                args[call.index] = args.get(call.index, "") + (call.function.arguments or "")
    assert reasoning == 'Paris first.Now Lyon, in "celsius".'
    assert [json.loads(a) for _, a in sorted(args.items())] == [{"city": "Paris"}, {"city": "Lyon", "unit": "celsius"}]
    assert dispatches == 2
