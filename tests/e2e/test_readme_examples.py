"""The README's first run, as a new user does it: the mesh started by the README's own `harnessmesh up` line
(no flags: the demo model names its own parsers, and its script answers), and every command of its tour
block, read out of README.md, checked against what the README says they print. The gateway's access line is
read from the same mesh's JSON log."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.mesh import RunningMesh, running_mesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)


def first_command_args() -> list[str]:
    """The options of the README's first command (``... && harnessmesh up OPTIONS``)."""
    line = next(line for line in _bash_blocks(README)[0].splitlines() if "harnessmesh up" in line)
    return shlex.split(line.split("harnessmesh up", 1)[1])


def example_commands() -> list[list[str]]:
    """Each command of the five-minute tour's block, split as bash would (comment lines dropped)."""
    section = README.split("## A five-minute tour\n", 1)[1].split("\n## ", 1)[0]
    (block,) = _bash_blocks(section)
    commands: list[str] = []
    for line in block.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line.startswith(("curl ", "python ")):
            commands.append(line)
        else:
            commands[-1] += "\n" + line
    return [shlex.split(command) for command in commands]


@dataclass
class Curl:
    """A ``curl -s URL [-H 'k: v']... -d BODY`` command as the request curl sends."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    body: str = ""

    @classmethod
    def parse(cls, argv: list[str]) -> Curl:
        assert argv[0] == "curl"
        curl, rest = cls(""), iter(argv[1:])
        for arg in rest:
            if arg == "-s":
                continue
            if arg == "-H":
                name, _, value = next(rest).partition(":")
                curl.headers[name.strip().lower()] = value.strip()
            elif arg == "-d":
                curl.body = next(rest)
            else:
                assert not arg.startswith("-"), f"the test does not know curl's {arg}"
                curl.url = arg
        # -d without a content-type: curl sends a form type
        curl.headers.setdefault("content-type", "application/x-www-form-urlencoded")
        return curl

    @property
    def path(self) -> str:
        assert self.url.startswith("localhost:8000/"), self.url  # the first command's default port
        return self.url.removeprefix("localhost:8000")


def _sse(text: str) -> list[tuple[str, Any]]:
    """(event name or "", data) per SSE event; ``[DONE]`` left out."""
    events = []
    for chunk in text.split("\n\n"):
        name, data = "", ""
        for line in chunk.splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data += line[5:].strip()
        if data and data != "[DONE]":
            events.append((name, json.loads(data)))
    return events


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningMesh]:
    tmp = tmp_path_factory.mktemp("readme")
    args = first_command_args()
    assert "--script" not in args
    with running_mesh(args, tmp / "mesh.log") as running:
        yield running


def test_the_readme_runs_the_examples_this_test_checks() -> None:
    commands = example_commands()
    kinds = [(c[0], Curl.parse(c).path if c[0] == "curl" else c[1]) for c in commands]
    assert kinds == [("curl", "/v1/chat/completions"), ("curl", "/v1/chat/completions"), ("curl", "/v1/messages"),
                     ("curl", "/v1/responses"), ("curl", "/tokenize"), ("python", "examples/agent_tool_loop.py")]
    assert first_command_args() == []  # `harnessmesh up` with no flags: the demo model names its own parsers


async def test_readme_examples_show_what_the_readme_says(mesh: RunningMesh) -> None:
    commands = example_commands()
    curls = [Curl.parse(c) for c in commands if c[0] == "curl"]
    results: list[str] = []
    async with httpx.AsyncClient(timeout=30) as http:
        for curl in curls:
            # No timing assertion ("about a second" is the script's short completions, checked below by
            # content: filler text until max_tokens would end `length` with no reasoning or tool call).
            response = await http.post(mesh.http + curl.path, content=curl.body.encode(), headers=curl.headers)
            assert response.status_code == 200, (curl.path, response.text[:500])
            results.append(response.text)
    tool_turn, answer_turn, anthropic, responses, tokenize = results

    # 1. reasoning, then the get_weather call, finish_reason tool_calls, a usage chunk
    chunks = [data for _, data in _sse(tool_turn)]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas).strip()
    calls = [call for d in deltas for call in d.get("tool_calls") or []]
    assert calls[0]["function"]["name"] == "get_weather"
    assert json.loads("".join(c["function"].get("arguments") or "" for c in calls)) == {"city": "Paris"}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    assert chunks[-1]["usage"]["completion_tokens"] > 0

    # 2. the answer the README quotes, with reasoning beside it and the first turn's prompt cached
    body = json.loads(answer_turn)
    message = body["choices"][0]["message"]
    assert f'"{message["content"]}"' in README.replace("\n", " ")
    assert message["content"] == "It is 22 degrees and sunny in Paris." and message["reasoning_content"]
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0

    # 3. Anthropic: a thinking block, then a text block; end_turn
    events = _sse(anthropic)
    blocks = [data["content_block"]["type"] for name, data in events if name == "content_block_start"]
    assert blocks == ["thinking", "text"]
    assert [data["delta"]["stop_reason"] for name, data in events if name == "message_delta"] == ["end_turn"]

    # 4. Responses: reasoning and text (the script's greeting), ending response.completed
    names = [name for name, _ in _sse(responses)]
    assert names[-1] == "response.completed" and "response.incomplete" not in names
    assert "response.reasoning_text.delta" in names and "response.output_text.delta" in names
    text = "".join(data["delta"] for name, data in _sse(responses) if name == "response.output_text.delta")
    assert text.startswith("Hello!"), text

    # 5. token ids and the context length
    tokens = json.loads(tokenize)
    assert tokens["count"] == len(tokens["tokens"]) > 0 and tokens["max_model_len"] == 32768

    # 6. the gRPC harness: the tool run at its dispatch event, two turns, the summary the README prints
    argv = commands[-1]
    assert argv[argv.index("--target") + 1] == "127.0.0.1:8001"  # the first command's default gRPC port
    argv[argv.index("--target") + 1] = mesh.grpc
    done = await asyncio.to_thread(subprocess.run, [sys.executable, *argv[1:]], cwd=REPO, capture_output=True,
                                   text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert '[tool] get_weather({"city": "Paris"})' in done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    stated = re.search(r'`(\{"turns": .*?\})`', README.replace("\n", " "))
    assert stated is not None and summary == json.loads(stated.group(1))


async def test_the_gateway_writes_one_access_line_per_request(mesh: RunningMesh) -> None:
    (first, *_), session = [Curl.parse(c) for c in example_commands() if c[0] == "curl"], "readme-access-log"
    async with httpx.AsyncClient(timeout=30) as http:
        headers = {**first.headers, "x-session-id": session, "x-trajectory-id": "main"}
        turn = await http.post(mesh.http + first.path, content=first.body.encode(), headers=headers)
        missing = await http.get(mesh.http + "/v1/models/no-such-model")
    assert turn.status_code == 200 and missing.status_code == 404
    request_id = _sse(turn.text)[0][1]["id"]

    def access_lines() -> list[dict[str, Any]]:
        lines = mesh.log_path.read_text(errors="replace").splitlines()
        return [json.loads(line) for line in lines if '"gateway.access"' in line]

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        ours = [line for line in access_lines() if line.get("request_id") == request_id]
        missed = [line for line in access_lines() if line["path"] == "/v1/models/no-such-model"]
        if ours and missed:
            break
        await asyncio.sleep(0.1)
    assert len(ours) == 1, ours
    line = ours[0]
    assert (line["level"], line["service"], line["method"], line["path"], line["status"]) == (
        "info", "gateway", "POST", "/v1/chat/completions", 200)
    assert (line["session_id"], line["trajectory_id"]) == (session, "main")
    assert line["prompt_tokens"] > 0 and line["completion_tokens"] > 0 and "cached_tokens" in line
    assert line["duration_ms"] > 0
    assert len(missed) == 1 and missed[0]["status"] == 404 and missed[0]["request_id"]
    for entry in access_lines():  # never prompt text
        assert "weather" not in json.dumps(entry)
