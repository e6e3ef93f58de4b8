"""State that outlives one replica, on real processes: 2 gateways and 2 parse services over one JetStream.

``harnessmesh up --responses-store jetstream --prefix-watch-store jetstream --turn-links-store jetstream``
runs the nats-server (JetStream, token auth), gateway A and parse A, handing NATS's URL and token to both;
gateway B and parse B are started by hand on the same NATS (the token from the file ``up`` names) and
router. A client alternating gateways completes a Responses conversation with ``previous_response_id``; a
session whose turns alternate parse replicas gets its prefix break reported by the replica that did not
run the previous turn, and no false one on the replica whose own copy is stale; a trajectory whose turns
alternate gateways keeps its previous-turn links and ``execute_tool`` span (spans exported over OTLP to an
in-test collector, as the tracing e2e reads them).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import nats
import openai
import pytest

from tests.e2e.conftest import WEATHER_TOOL
from tests.support.mesh import RunningMesh, running_mesh
from tests.support.nats import free_port
from tests.support.otlp import Collector, ReceivedSpan, running_collector
from tests.support.procs import child_pids

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

TOOL_TURN = (
    "<think>\nThe user wants the weather in Paris.\n</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
SCRIPT = [
    {"match": "weather in Paris", "completion": TOOL_TURN},
    {"match": "22 degrees", "completion": "<think>\nThe tool answered.\n</think>\n\nIt is 22 degrees in Paris."},
    {"match": "", "completion": "Hello from the mesh."},
]
WEATHER: Any = [{"type": "function", "name": "get_weather", "description": "Current weather.",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
GATEWAY_STATE = ["--responses-store", "jetstream", "--turn-links-store", "jetstream"]
PARSE_STATE = ["--prefix-watch-store", "jetstream"]
MODEL = ["--served-model-name", "demo", "--reasoning-parser", "qwen3", "--tool-parser", "hermes"]


@dataclass(frozen=True)
class Replicas:
    """Gateway A (in the mesh) and gateway B (by hand); parse B's log file; the spans every process exports."""

    mesh: RunningMesh
    gateway_b: str
    parse_b_log: Path
    collector: Collector


def _option(pid: int, flag: str) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return argv[argv.index(flag) + 1]


def _wait_ready(url: str, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{what} exited with {proc.returncode}"
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{what} did not become ready")


def _otlp(endpoint: str) -> dict[str, str]:
    return {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_BSP_SCHEDULE_DELAY": "100"}


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    tmp = tmp_path_factory.mktemp("replicas")
    script = tmp / "script.jsonl"
    script.write_text("".join(json.dumps(line) + "\n" for line in SCRIPT))
    with running_collector() as (endpoint, collector), running_mesh(
        ["--workers", "1", "--speedup", "50", "--script", str(script), *MODEL, *GATEWAY_STATE, *PARSE_STATE],
        tmp / "mesh.log", env=_otlp(endpoint),
    ) as mesh:
        (parse_a,) = child_pids(mesh.process.pid, "services.parse")
        router = _option(parse_a, "--router-address")
        parse_port, http_port = free_port(), free_port()
        procs: list[subprocess.Popen[bytes]] = []
        parse_log = tmp / "parse-b.log"
        env = {**os.environ, **_otlp(endpoint), "HARNESSMESH_NATS_TOKEN": mesh.nats_token}
        assert mesh.nats_token, "harnessmesh up starts its nats-server with a token"
        try:
            with parse_log.open("wb") as log_b, (tmp / "gateway-b.log").open("wb") as log_g:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "services.parse", "--port", str(parse_port), "--router-address", router,
                     "--nats-url", mesh.nats, *MODEL, *PARSE_STATE], stdout=log_b, stderr=log_b, env=env))
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "gateway", "--http-port", str(http_port), "--grpc-port", str(free_port()),
                     "--parse-address", f"127.0.0.1:{parse_port}", "--nats-url", mesh.nats, *GATEWAY_STATE],
                    stdout=log_g, stderr=log_g, env=env))
            gateway_b = f"http://127.0.0.1:{http_port}"
            _wait_ready(gateway_b, procs[1], "gateway B")
            yield Replicas(mesh, gateway_b, parse_log, collector)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=60)


async def test_responses_conversation_alternating_gateways(replicas: Replicas) -> None:
    a, b = _client(replicas.mesh.http), _client(replicas.gateway_b)
    first = await a.responses.create(model="demo", input="What is the weather in Paris?", tools=WEATHER)
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    second = await b.responses.create(  # on the other gateway replica
        model="demo", previous_response_id=first.id, tools=WEATHER, stream=True,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "22 degrees"}])
    completed: Any = [event async for event in second][-1]
    assert completed.type == "response.completed"
    assert completed.response.output_text == "It is 22 degrees in Paris."
    assert completed.response.usage.input_tokens_details.cached_tokens > 0  # turn 1's prompt: one conversation
    third = await a.responses.create(model="demo", previous_response_id=completed.response.id, input="Thanks")
    assert third.output_text == "Hello from the mesh."
    assert (await b.responses.retrieve(third.id)).previous_response_id == completed.response.id
    await b.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        await a.responses.retrieve(first.id)


def _breaks(log: str, session: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log.splitlines() if '"parse.prefix_break"' in line]
    return [line for line in lines if line.get("session_id") == session]


async def test_prefix_break_report_survives_alternating_parse_replicas(replicas: Replicas) -> None:
    session = "replicas-" + uuid.uuid4().hex
    headers = {"x-session-id": session, "anthropic-version": "2023-06-01", "x-api-key": "k"}
    gateways = [replicas.mesh.http, replicas.gateway_b, replicas.mesh.http]  # parse A, B, A
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Say hello"}]
    systems = ["You are a helpful agent. build=1", "You are a helpful agent. build=2",
               "You are a helpful agent. build=2"]
    for i, (url, system) in enumerate(zip(gateways, systems, strict=True)):
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            reply = await http.post("/v1/messages", headers=headers, json={
                "model": "demo", "max_tokens": 64, "system": system, "messages": messages})
        assert reply.status_code == 200, reply.text
        messages += [{"role": "assistant", "content": reply.json()["content"]},
                     {"role": "user", "content": f"Again, {i}"}]
    # turn 2 ran on parse B, which never saw turn 1: it found the changed header from the shared copy
    (report,) = _breaks(replicas.parse_b_log.read_text(), session)
    assert "build=⟂1" in report["expected"] and "build=⟂2" in report["actual"] and report["in_output"] is False
    # turn 3 extends turn 2: parse A, whose own copy held turn 1, read turn 2 through and reported nothing
    assert _breaks(replicas.mesh.log_path.read_text(), session) == []


async def test_the_state_lives_in_the_buckets_of_the_nats_up_started(replicas: Replicas) -> None:
    """``harnessmesh up`` gave gateway A and parse A its own nats-server's URL and token: their buckets exist."""
    nc = await nats.connect(replicas.mesh.nats, token=replicas.mesh.nats_token)
    try:
        js = nc.jetstream()
        async with httpx.AsyncClient(base_url=replicas.mesh.http, timeout=60) as http:  # a turn on gateway A
            reply = await http.post("/v1/responses", json={"model": "demo", "input": "Say hello"})
        assert reply.status_code == 200, reply.text
        for kind in ("responses", "turn_links", "prefix_watch"):
            status = await (await js.key_value(f"harnessmesh_default_{kind}")).status()
            assert status.bucket == f"harnessmesh_default_{kind}"
        responses = await js.stream_info("KV_harnessmesh_default_responses")
        assert responses.state.messages >= 1
    finally:
        await nc.close()


def _chat_roots(spans: list[ReceivedSpan], session: str) -> list[ReceivedSpan]:
    return sorted((s for s in spans if s.name == "chat demo" and s.attributes.get("session.id") == session),
                  key=lambda s: s.start_ns)


async def test_turn_links_survive_turns_landing_on_different_gateways(replicas: Replicas) -> None:
    session, trajectory = "links-" + uuid.uuid4().hex, "traj-links"
    headers = {"x-session-id": session, "x-trajectory-id": trajectory, "user-agent": "my-agent/1.0"}
    body: dict[str, Any] = {"model": "demo", "tools": [WEATHER_TOOL],
                            "messages": [{"role": "user", "content": "What is the weather in Paris?"}]}
    gateways = [replicas.mesh.http, replicas.gateway_b, replicas.mesh.http]  # A, B, A
    async with httpx.AsyncClient(timeout=60) as http:
        first = await http.post(gateways[0] + "/v1/chat/completions", headers=headers, json=body)
        assert first.status_code == 200, first.text
        message = first.json()["choices"][0]["message"]
        (call,) = message["tool_calls"]
        body["messages"] += [message, {"role": "tool", "tool_call_id": call["id"], "content": "22 degrees"}]
        second = await http.post(gateways[1] + "/v1/chat/completions", headers=headers, json=body)
        assert second.status_code == 200, second.text
        body["messages"] += [second.json()["choices"][0]["message"], {"role": "user", "content": "Thanks"}]
        third = await http.post(gateways[2] + "/v1/chat/completions", headers=headers, json=body)
        assert third.status_code == 200, third.text

    def complete(spans: list[ReceivedSpan]) -> bool:
        return len(_chat_roots(spans, session)) == 3 and any(
            s.name == "execute_tool get_weather" and s.attributes.get("session.id") == session for s in spans)

    for _ in range(150):
        if complete(replicas.collector.snapshot()):
            break
        await asyncio.sleep(0.1)
    spans = replicas.collector.snapshot()
    turn1, turn2, turn3 = _chat_roots(spans, session)
    assert (turn1.trace_id, turn1.span_id) in turn2.links  # turn 2 on gateway B links to turn 1 on gateway A
    assert turn2.links == ((turn1.trace_id, turn1.span_id),)
    # turn 3 is back on A, whose memory would have said turn 1: the shared links say turn 2
    assert turn3.links == ((turn2.trace_id, turn2.span_id),)
    (tool,) = [s for s in spans if s.name == "execute_tool get_weather" and s.trace_id == turn2.trace_id]
    assert tool.parent_span_id == turn2.span_id and tool.links == ((turn1.trace_id, turn1.span_id),)
    assert tool.attributes["gen_ai.tool.call.id"] == call["id"] and tool.attributes["gen_ai.agent.id"] == trajectory
    assert tool.start_ns <= tool.end_ns
