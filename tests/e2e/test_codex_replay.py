"""Every recorded Responses request (``tests/fixtures/captures``), and the openai SDK, through the real mesh.

Unlike ``tests/gateway/apis/responses/test_replay.py`` this renders each request with the demo model's
real chat template (developer messages, namespace and custom tools, replayed reasoning and
function calls), routes it to a mocker worker and checks the typed stream that comes back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import WEATHER_TOOL
from tests.gateway.apis.responses.test_replay import _DROP_HEADERS, CASES, EVENTS, parse_sse
from tests.support.mesh import RunningMesh, running_mesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
ANSWER = "<think>\nThe request was replayed.\n</think>\n\nDone."


@pytest.fixture(scope="module")
def replay_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningMesh]:
    """One mocker worker that answers every request with a short reasoned text turn."""
    tmp = tmp_path_factory.mktemp("replay-mesh")
    script = tmp / "script.jsonl"
    script.write_text(json.dumps({"match": "", "completion": ANSWER}) + "\n")
    args = ["--workers", "1", "--speedup", "50", "--script", str(script), "--reasoning-parser", "qwen3",
            "--tool-parser", "hermes", "--served-model-name", "demo", "--block-size", "16"]
    with running_mesh(args, tmp / "mesh.log") as mesh:
        yield mesh


async def test_every_captured_request_streams_to_completion(replay_mesh: RunningMesh) -> None:
    assert CASES
    async with httpx.AsyncClient(base_url=replay_mesh.http, timeout=60) as http:
        for name, request in CASES:
            body = {**request["body"], "model": "demo", "stream": True}
            headers = {k: v for k, v in request["headers"].items() if k.lower() not in _DROP_HEADERS}
            reply = await http.post("/v1/responses", json=body, headers=headers)
            assert reply.status_code == 200, (name, reply.text[:2000])
            events = parse_sse(reply.text)
            for event in events:
                EVENTS.validate_python(event)
            assert events[-1]["type"] == "response.completed", (name, events[-1])
            usage = events[-1]["response"]["usage"]
            assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0, name
            output = events[-1]["response"]["output"]
            if body["input"][-1] == {"type": "compaction_trigger"}:  # a remote compaction: one sealed summary
                assert [o["type"] for o in output] == ["compaction"], name
                continue
            assert [o["type"] for o in output] == ["reasoning", "message"], name
            assert output[1]["content"][0]["text"] == "Done."


async def test_openai_sdk_tool_loop_with_previous_response_id(mesh: RunningMesh) -> None:
    """The official SDK's typed stream through the real mesh: tool call, output, prefix-cached answer."""
    client = openai.AsyncOpenAI(base_url=mesh.http + "/v1", api_key="sk-test", max_retries=0)
    fn = WEATHER_TOOL["function"]
    tools: Any = [{"type": "function", "name": fn["name"], "description": fn["description"],
                   "parameters": fn["parameters"]}]
    first = await client.responses.create(model="demo", instructions="You are a helpful assistant. " * 8,
                                          input="What is the weather in Paris today?", tools=tools, stream=True)
    events = [e async for e in first]
    done: Any = events[-1]
    assert done.type == "response.completed"
    call = next(o for o in done.response.output if o.type == "function_call")
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris", "unit": "celsius"}
    assert any(e.type == "response.reasoning_summary_text.delta" for e in events)

    second = await client.responses.create(
        model="demo", previous_response_id=done.response.id, tools=tools, stream=True,
        instructions="You are a helpful assistant. " * 8,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "22 degrees, sunny"}],
    )
    final: Any = [e async for e in second][-1]
    assert final.type == "response.completed"
    assert "22 degrees" in final.response.output_text
    assert final.response.usage.input_tokens_details.cached_tokens > 0
