"""Through the real mesh: every finished turn is recorded in parse's prefix watch, whatever the client does after
the finish (issue 34). On each API a client reads a turn up to its finish and closes the stream at once; ten
turns on each API are ten turns recorded (``harnessmesh_parse_prefix_turns``), counted at parse's /metrics."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.api import chat_pb2, chat_pb2_grpc
from tests.support.mesh import RunningMesh, running_mesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

TURNS = 10
ANSWER = "<think>\nA short thought.\n</think>\n\n" + "The answer, at some length: " + "word " * 40


@pytest.fixture(scope="module")
def watch_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningMesh]:
    tmp = tmp_path_factory.mktemp("early_close_mesh")
    script = tmp / "script.jsonl"
    script.write_text(json.dumps({"match": "early close", "completion": ANSWER}) + "\n")
    args = ["--workers", "1", "--speedup", "20", "--script", str(script), "--reasoning-parser", "qwen3",
            "--tool-parser", "hermes", "--served-model-name", "demo"]
    with running_mesh(args, Path(tmp) / "mesh.log") as mesh:
        yield mesh


async def recorded(mesh: RunningMesh) -> float:
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(mesh.metrics["parse"])).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "harnessmesh_parse_prefix_turns_total")


async def sse_until(mesh: RunningMesh, path: str, body: dict[str, object], session: str,
                    finished: Callable[[str], bool]) -> None:
    """POST a streaming request and close the connection on the first line ``finished`` accepts."""
    async with httpx.AsyncClient(timeout=60) as http, http.stream(
        "POST", mesh.http + path, json=body, headers={"x-session-id": session}
    ) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if finished(line):
                return  # leaving the block closes the stream right after the finish
    raise AssertionError("the stream ended without a finish")


async def chat(mesh: RunningMesh, session: str) -> None:
    body = {"model": "demo", "stream": True, "messages": [{"role": "user", "content": "early close please"}]}
    await sse_until(mesh, "/v1/chat/completions", body, session, lambda line: '"finish_reason":"' in
                    line.replace(" ", ""))


async def anthropic(mesh: RunningMesh, session: str) -> None:
    body = {"model": "demo", "stream": True, "max_tokens": 256,
            "messages": [{"role": "user", "content": "early close please"}]}
    await sse_until(mesh, "/v1/messages", body, session, lambda line: '"stop_reason":"' in line.replace(" ", ""))


async def responses(mesh: RunningMesh, session: str) -> None:
    body = {"model": "demo", "stream": True, "input": "early close please"}
    await sse_until(mesh, "/v1/responses", body, session, lambda line: "response.completed" in line)


async def grpc_edge(mesh: RunningMesh, session: str) -> None:
    request = chat_pb2.ChatRequest(
        model="demo", messages=[chat_pb2.Message(role="user", parts=[chat_pb2.Part(text="early close please")])])
    async with grpc.aio.insecure_channel(mesh.grpc) as channel:
        call = chat_pb2_grpc.AgentServiceStub(channel).Chat(request, metadata=(("x-session-id", session),))
        async for batch in call:
            if any(e.HasField("finish") for e in batch.events):
                call.cancel()  # close right after the finish
                return
    raise AssertionError("the stream ended without a finish")


APIS: dict[str, Callable[[RunningMesh, str], Awaitable[None]]] = {
    "chat": chat, "anthropic": anthropic, "responses": responses, "grpc_edge": grpc_edge}


@pytest.mark.parametrize("api", sorted(APIS))
async def test_ten_turns_closed_at_the_finish_are_ten_recorded(watch_mesh: RunningMesh, api: str) -> None:
    before = await recorded(watch_mesh)
    for turn in range(TURNS):
        await APIS[api](watch_mesh, f"early-{api}-{turn}")
    for _ in range(20):  # the count moves before the finish goes out; allow the scrape a moment anyway
        if await recorded(watch_mesh) - before >= TURNS:
            break
        await asyncio.sleep(0.1)
    assert await recorded(watch_mesh) - before == TURNS
