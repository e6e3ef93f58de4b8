"""Through the real mesh (`harnessmesh up`, one mocker worker with little KV): a turn that ends in a tool call,
then unrelated turns that answer and overflow the KV, then the tool result. With retention on the tool-result
turn finds its previous prompt cached; with `--no-retention` it finds none of it. And a sub-agent that answered
its parent has its blocks evicted before an older unrelated answered turn's (docs/agent-kv.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import WEATHER_TOOL
from tests.support.mesh import running_mesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima",
         "mike", "november", "oscar", "papa")


def filler(seed: int, words: int = 60) -> str:
    return " ".join(f"{WORDS[(seed * 7 + i * 3) % len(WORDS)]}{seed}-{i}" for i in range(words))


async def chat(http: httpx.AsyncClient, base: str, messages: list[Any],
               headers: dict[str, str] | None = None) -> dict[str, Any]:
    body = {"model": "demo", "messages": messages, "tools": [WEATHER_TOOL], "max_tokens": 40}
    response = await http.post(base + "/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return dict(response.json())


@pytest.mark.parametrize("retention", [True, False])
async def test_the_tool_result_turn_finds_its_prompt_cached_only_with_retention(
        tmp_path: Path, retention: bool) -> None:
    script = tmp_path / "script.jsonl"
    script.write_text(json.dumps({"match": "weather in Paris", "completion": CALL}) + "\n"
                      + json.dumps({"match": "summarise", "completion": "Done: a short summary."}) + "\n")
    args = ["--workers", "1", "--speedup", "1000", "--script", str(script), "--tool-parser", "hermes",
            "--served-model-name", "demo", "--block-size", "16", "--num-blocks", "96",
            "--retention" if retention else "--no-retention"]
    with running_mesh(args, tmp_path / "mesh.log") as mesh:
        async with httpx.AsyncClient(timeout=60) as http:
            first = [{"role": "user", "content": f"{filler(0)}\nWhat is the weather in Paris?"}]
            reply = await chat(http, mesh.http, first)
            (call,) = reply["choices"][0]["message"]["tool_calls"]
            prompt = reply["usage"]["prompt_tokens"]
            for k in range(1, 9):  # other sessions' turns that end with an answer, overflowing 96 x 16 tokens
                answered = await chat(http, mesh.http, [{"role": "user", "content": f"{filler(k)}\nsummarise"}])
                assert answered["choices"][0]["finish_reason"] == "stop"
            head = answered["usage"]["prompt_tokens_details"]["cached_tokens"]  # the tools' and template's shared head
            result = [*first, {"role": "assistant", "content": None, "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": call["id"], "content": "18 C, clear"}]
            usage = (await chat(http, mesh.http, result))["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert 8 * prompt > 96 * 16 and head < 0.5 * prompt, (prompt, head)  # the answered turns overflowed the KV
    if retention:
        assert cached >= 0.9 * prompt, (cached, prompt, head)
    else:
        assert cached <= head, (cached, prompt, head)  # nothing of the session's own prompt


def _marked_blocks(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith("harnessmesh_worker_kv_retention_marked_blocks_total{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# A sub-agent (it names its parent) that answers, and a session whose client closes it with its turn (Dynamo's
# header): either way the turn's blocks will not be read again.
DONE = {"sub-agent": {"x-session-id": "parent", "x-trajectory-id": "agent-1", "x-parent-trajectory-id": "parent"},
        "closed session": {"x-session-id": "closing", "x-dynamo-session-final": "true"}}


@pytest.mark.parametrize("done_by", list(DONE))
@pytest.mark.parametrize("retention", [True, False])
async def test_a_finished_sub_agents_or_closed_sessions_blocks_go_before_an_older_answered_turns(
        tmp_path: Path, retention: bool, done_by: str) -> None:
    script = tmp_path / "script.jsonl"
    script.write_text(json.dumps({"match": "summarise", "completion": "Done: a short summary."}) + "\n")
    args = ["--workers", "1", "--speedup", "1000", "--script", str(script), "--tool-parser", "hermes",
            "--served-model-name", "demo", "--block-size", "16", "--num-blocks", "96",
            "--retention" if retention else "--no-retention"]
    with running_mesh(args, tmp_path / "mesh.log") as mesh:
        async with httpx.AsyncClient(timeout=60) as http:
            older = [{"role": "user", "content": f"{filler(1)}\nsummarise"}]
            first = await chat(http, mesh.http, older, {"x-session-id": "main-a"})      # an answer: plain LRU
            prompt = first["usage"]["prompt_tokens"]
            done = await chat(http, mesh.http, [{"role": "user", "content": f"{filler(2)}\nsummarise"}], DONE[done_by])
            assert done["choices"][0]["finish_reason"] == "stop"                      # it answered
            # another session's turn needs more blocks than are free: ~25 of the ~80 cached must go
            await chat(http, mesh.http, [{"role": "user", "content": f"{filler(3, 80)}\nsummarise"}],
                       {"x-session-id": "main-c"})
            again = await chat(http, mesh.http, older, {"x-session-id": "main-a"})
            (worker,) = [url for name, url in mesh.metrics.items() if name.startswith("worker-")]
            marked = _marked_blocks((await http.get(worker)).text)
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    if retention:  # the finished turn's blocks went first: the older answered turn is whole
        assert cached >= 0.9 * prompt and marked > 0, (cached, prompt, marked)
    else:          # plain LRU: the older turn's tail went
        assert cached < 0.7 * prompt and marked == 0, (cached, prompt, marked)
