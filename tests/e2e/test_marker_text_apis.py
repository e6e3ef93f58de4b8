"""Issue 34's reported failure through the real mesh, on Chat Completions and Anthropic Messages: a model that
writes its own call syntax in prose (``"<tool_call>"``) and then makes a real call. The literal stays in the
text, the call is a call, and the turn finishes ``tool_calls`` / ``tool_use`` (hermes and qwen3_coder)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.parse.test_marker_text import CALLS, PROSE
from tests.support.mesh import RunningMesh, running_mesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

BASH = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
QUESTION = "Explain your tool syntax, then list the files."


@pytest.fixture(scope="module", params=sorted(CALLS))
def marker_mesh(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[str, RunningMesh]]:
    parser = str(request.param)
    tmp = tmp_path_factory.mktemp(f"marker-{parser}")
    script = tmp / "script.jsonl"
    script.write_text(json.dumps({"match": "tool syntax", "completion": PROSE + CALLS[parser]}) + "\n")
    args = ["--workers", "1", "--speedup", "50", "--script", str(script), "--reasoning-parser", "qwen3",
            "--tool-parser", parser, "--served-model-name", "demo"]
    with running_mesh(args, tmp / "mesh.log") as mesh:
        yield parser, mesh


async def test_chat_completions_keeps_the_literal_and_makes_the_call(marker_mesh: tuple[str, RunningMesh]) -> None:
    _, mesh = marker_mesh
    body = {"model": "demo", "messages": [{"role": "user", "content": QUESTION}],
            "tools": [{"type": "function", "function": {"name": "Bash", "parameters": BASH}}]}
    async with httpx.AsyncClient(timeout=60) as http:
        reply = (await http.post(mesh.http + "/v1/chat/completions", json=body)).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == PROSE
    calls = choice["message"]["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("Bash", {"command": "ls -la"})]


async def test_anthropic_messages_keeps_the_literal_and_makes_the_call(marker_mesh: tuple[str, RunningMesh]) -> None:
    _, mesh = marker_mesh
    body = {"model": "demo", "max_tokens": 512, "messages": [{"role": "user", "content": QUESTION}],
            "tools": [{"name": "Bash", "input_schema": BASH}]}
    async with httpx.AsyncClient(timeout=60) as http:
        reply = (await http.post(mesh.http + "/v1/messages", json=body,
                                 headers={"anthropic-version": "2023-06-01"})).json()
    assert reply["stop_reason"] == "tool_use"
    assert [b["text"] for b in reply["content"] if b["type"] == "text"] == [PROSE]
    assert [(b["name"], b["input"]) for b in reply["content"] if b["type"] == "tool_use"] == [
        ("Bash", {"command": "ls -la"})]
