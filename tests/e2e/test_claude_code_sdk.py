"""The Anthropic Messages API on the real mesh: the official SDK, captured Claude Code traffic, prefix breaks."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.fixtures import CAPTURES
from tests.support.mesh import RunningMesh, running_mesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

MODEL = "demo"
ALIASES = ["mock-model", "claude-opus-5-5", "claude-sonnet-4-5-20250929"]
TOOL_TURN = (
    "<think>\nI need the weather. I will call get_weather.\n</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
FINAL_TURN = "<think>\nThe tool answered.\n</think>\n\nIt is 22 degrees in Paris."
SCRIPT = [{"match": "22 degrees", "completion": FINAL_TURN}, {"match": "weather in Paris", "completion": TOOL_TURN},
          {"match": "", "completion": "Hello from the mesh."}]
WEATHER = {"name": "get_weather", "description": "Current weather.", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
SYSTEM = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.330.930; cc_entrypoint=sdk-cli;"},
          {"type": "text", "text": "You are a helpful agent. " * 40, "cache_control": {"type": "ephemeral"}}]


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningMesh]:
    tmp = tmp_path_factory.mktemp("anthropic-mesh")
    script = tmp / "script.jsonl"
    script.write_text("".join(json.dumps(line) + "\n" for line in SCRIPT))
    args = ["--workers", "1", "--speedup", "50", "--script", str(script), "--reasoning-parser", "qwen3",
            "--tool-parser", "hermes", "--served-model-name", MODEL, "--block-size", "16",
            *[a for name in ALIASES for a in ("--model-alias", f"{name}={MODEL}")]]
    with running_mesh(args, tmp / "mesh.log") as running:
        yield running


def client(mesh: RunningMesh) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=mesh.http, api_key="sk-test", max_retries=0, timeout=60)


def first_turn(question: str = "What is the weather in Paris?") -> list[dict[str, Any]]:
    return [{"role": "user", "content": question}]


async def test_stream_tool_loop_thinking_round_trip_and_cache(mesh: RunningMesh) -> None:
    api = client(mesh)
    session = {"X-Claude-Code-Session-Id": "sdk-" + uuid.uuid4().hex}
    kwargs: dict[str, Any] = {"model": MODEL, "max_tokens": 256, "system": SYSTEM, "tools": [WEATHER],
                              "extra_headers": session}
    async with api.messages.stream(messages=first_turn(), **kwargs) as stream:  # type: ignore[arg-type]
        async for _ in stream:
            pass
        first = await stream.get_final_message()
    assert [b.type for b in first.content] == ["thinking", "tool_use"]
    assert first.stop_reason == "tool_use"
    call: Any = first.content[1]
    assert call.name == "get_weather" and call.input == {"city": "Paris"}
    messages = [*first_turn(), {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "22 degrees"}]}]
    second = await api.messages.create(messages=messages, **kwargs)  # type: ignore[arg-type]
    assert second.stop_reason == "end_turn"
    assert [b.type for b in second.content] == ["thinking", "text"]
    assert "22 degrees" in second.content[1].text  # type: ignore[union-attr]
    assert second.usage.cache_read_input_tokens and second.usage.cache_read_input_tokens >= first.usage.input_tokens
    count = await api.messages.count_tokens(model=MODEL, system=SYSTEM, tools=[WEATHER], messages=messages)  # type: ignore[arg-type]
    assert count.input_tokens == second.usage.input_tokens + second.usage.cache_read_input_tokens
    log = mesh.log_path.read_text()
    assert "gateway.anthropic.thinking_signatures" not in log  # our signature came back and checked out
    assert not [line for line in log.splitlines() if "parse.prefix_break" in line and session[
        "X-Claude-Code-Session-Id"] in line]


async def test_count_tokens_is_the_real_prompt(mesh: RunningMesh) -> None:
    api = client(mesh)
    question = "Count me " + uuid.uuid4().hex  # a fresh prompt: nothing of it past the system part is cached
    messages = first_turn(question)
    count = await api.messages.count_tokens(model=MODEL, system=SYSTEM, messages=messages,  # type: ignore[arg-type]
                                            thinking={"type": "disabled"})
    reply = await api.messages.create(model=MODEL, max_tokens=16, system=SYSTEM, messages=messages,  # type: ignore[arg-type]
                                      thinking={"type": "disabled"})
    assert count.input_tokens == reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0)
    unstripped = await api.messages.count_tokens(model=MODEL, system=SYSTEM, messages=messages,  # type: ignore[arg-type]
                                                 thinking={"type": "disabled"},
                                                 extra_headers={"x-harnessmesh-strip-anthropic-preamble": "0"})
    assert unstripped.input_tokens > count.input_tokens  # the billing line is counted only when kept


async def test_typed_errors_for_bad_input(mesh: RunningMesh) -> None:
    api = client(mesh)
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        await api.messages.create(model=MODEL, max_tokens=0, messages=first_turn())  # type: ignore[arg-type]
    with pytest.raises(anthropic.NotFoundError):
        await api.messages.create(model="no-such-model", max_tokens=8, messages=first_turn())  # type: ignore[arg-type]
    too_long = [{"role": "user", "content": "word " * 40000}]  # > the demo model's 32,768-token context
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
        await api.messages.create(model=MODEL, max_tokens=8, messages=too_long)  # type: ignore[arg-type]


async def test_max_tokens_is_a_cap_not_a_reason_to_refuse(mesh: RunningMesh) -> None:
    # Claude Code asks for max_tokens=32000 whatever the model: a prompt that fits is served.
    reply = await client(mesh).messages.create(model=MODEL, max_tokens=262144, messages=first_turn())  # type: ignore[arg-type]
    assert reply.stop_reason in ("end_turn", "tool_use", "max_tokens")


async def _two_turns(mesh: RunningMesh, session: str, headers: dict[str, str], cch: bool) -> None:
    async with httpx.AsyncClient(base_url=mesh.http, timeout=60) as http:
        body: dict[str, Any] = {"model": MODEL, "max_tokens": 64, "system": copy.deepcopy(SYSTEM),
                                "messages": first_turn("Say hello")}
        hdrs = {"X-Claude-Code-Session-Id": session, "anthropic-version": "2023-06-01", **headers}
        if cch:
            body["system"][0]["text"] += " cch=00001;"
        first = (await http.post("/v1/messages", json=body, headers=hdrs)).json()
        body["messages"] += [{"role": "assistant", "content": first["content"]},
                             {"role": "user", "content": "Say it again"}]
        if cch:  # Claude Code's per-request content hash: a new value every request
            body["system"][0]["text"] = body["system"][0]["text"].replace("cch=00001", "cch=00002")
        second = await http.post("/v1/messages", json=body, headers=hdrs)
        assert second.status_code == 200


async def test_cache_poisoning_header_is_reported_and_strip_prevents_it(mesh: RunningMesh) -> None:
    poisoned, clean = "poison-" + uuid.uuid4().hex, "clean-" + uuid.uuid4().hex
    await _two_turns(mesh, poisoned, {"x-harnessmesh-strip-anthropic-preamble": "0"}, cch=True)
    await _two_turns(mesh, clean, {}, cch=True)
    lines = [json.loads(line) for line in mesh.log_path.read_text().splitlines()
             if '"parse.prefix_break"' in line]
    reports = [r for r in lines if r["session_id"] == poisoned]
    assert len(reports) == 1
    assert "cch=0000" in reports[0]["expected"] and "cch=0000" in reports[0]["actual"]
    assert reports[0]["offset"] > 0 and reports[0]["in_output"] is False
    assert not [r for r in lines if r["session_id"] == clean]


def _captured() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(CAPTURES.glob("claude-code_*.json")) + sorted(CAPTURES.glob("python-sdks_anthropic*.json")):
        data = json.loads(path.read_text())
        for i, req in enumerate(data.get("requests") or [data]):
            if req["path"].startswith(("/v1/messages", "/v1/models")):
                out.append((f"{path.stem}[{i}]", req))
    return out


async def test_replay_every_captured_claude_code_request(mesh: RunningMesh) -> None:
    captured = _captured()
    assert len(captured) >= 20
    skip = {"host", "content-length", "accept-encoding", "connection"}
    too_long = []
    async with httpx.AsyncClient(base_url=mesh.http, timeout=60) as http:
        for name, req in captured:
            headers = {k: v for k, v in req["headers"].items() if k.lower() not in skip}
            if req["method"] == "GET":
                r = await http.get(req["path"], headers=headers)
                assert r.status_code == 200, (name, r.text)
                assert r.json()["data"][0]["id"] in (MODEL, *ALIASES), name
                continue
            r = await http.post(req["path"], json=req["body"], headers=headers)
            if r.status_code == 400 and "prompt is too long" in r.json()["error"]["message"]:
                too_long.append(name)  # the demo model's 32k context (the mocker enforces it): a valid answer
                continue
            assert r.status_code == 200, (name, r.text[:500])
            if "count_tokens" in req["path"]:
                assert r.json()["input_tokens"] > 0, name
            elif req["body"].get("stream"):
                kinds = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
                assert kinds[0] == "message_start" and kinds[-1] == "message_stop", (name, kinds)
                assert "[DONE]" not in r.text
            else:
                assert r.json()["type"] == "message" and r.json()["content"], name
    # Only the requests for Claude model names (all tools inline, no deferred ones: ~44k tokens) exceed 32k.
    assert set(too_long) <= {"claude-code_2.1.330_disable-experimental-betas[0]",
                             "claude-code_2.1.330_model-claude-sonnet-4-5[0]"}, too_long
