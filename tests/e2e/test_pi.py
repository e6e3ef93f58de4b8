"""Real pi (the version in ``.ci/harnesses/clients.txt``) against the real mesh: a two-turn tool loop per API.

pi is configured only with what ``harnessmesh catalog pi`` prints, saved whole as
``~/.pi/agent/models.json`` (as the README says); it picks the API by the catalog's provider
(``harnessmesh``: Chat Completions, ``harnessmesh-responses``, ``harnessmesh-anthropic``). The mocker's
script makes the model think, then call pi's ``bash`` tool; pi runs it and sends its output back; the
model answers. A recording pass-through between pi and the gateway keeps what pi really sent: the
second request carries the tool's output, and, on the API run with reasoning on (``--thinking high``),
the first turn's reasoning replayed. The mesh's trace records give each turn's cached tokens: turn 2
must reuse turn 1's prompt.

Runs only inside ``.ci/harnesses/offline.sh`` (``HARNESS_OFFLINE=1``), as ``.ci/run`` does.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.harness import (
    WIRE_APIS,
    RecordingProxy,
    client_binary,
    configure_pi,
    offline_harness_marks,
    reasoning_requested,
    replayed_reasoning,
    run_pi,
    scripted_mesh,
    stdout_events,
    trace_records,
)

MODEL = "mesh-pi"
MARKER = "harnessmesh-pi-ok"  # the tool's output; the command itself does not contain it
PROMPT = "Run the greeting command and tell me what it printed."
PI_TIMEOUT = float(os.environ.get("PI_TIMEOUT", "90"))
BLOCK = 16  # the mesh's --block-size
REASONING = "The user wants the greeting command. I will use bash."
TOOL_TURN = (f"<think>\n{REASONING}\n</think>\n\n"
             '<tool_call>\n{"name": "bash", "arguments": {"command": "echo harnessmesh pi ok | tr \' \' -"}}\n'
             "</tool_call>")
FINAL_TURN = f"<think>\nThe command succeeded.\n</think>\n\nThe greeting command printed {MARKER}."
SCRIPT = [{"match": MARKER, "completion": FINAL_TURN}, {"match": "greeting command", "completion": TOOL_TURN}]
THINKING = {"anthropic-messages": "high"}  # reasoning on for one API; "off" for the others

pytestmark = offline_harness_marks("pi")


@pytest.fixture(scope="module")
def pi_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RecordingProxy, Path]]:
    """The mesh behind a recording pass-through; yields (proxy, trace records file)."""
    client_binary("pi")  # skips before starting a mesh when it is not installed
    tmp = tmp_path_factory.mktemp("pi-mesh")
    records = tmp / "records.jsonl"
    with scripted_mesh(tmp, SCRIPT, MODEL, ["--trace-records", str(records)]) as mesh, \
            RecordingProxy(mesh.http) as proxy:
        yield proxy, records


@pytest.mark.parametrize("api", list(WIRE_APIS))
def test_pi_runs_a_tool_loop_over_each_api(pi_mesh: tuple[RecordingProxy, Path], api: str, tmp_path: Path,
                                           record_property: Callable[[str, object], None]) -> None:
    proxy, records_path = pi_mesh
    provider, path, record_api = WIRE_APIS[api]
    workdir = tmp_path / "pi"
    config = configure_pi(proxy.url, workdir)
    assert config["providers"][provider]["api"] == api
    thinking = THINKING.get(api, "off")
    already, started, clock = len(proxy.posts(path)), time.time(), time.monotonic()
    status = run_pi(workdir, ["--provider", provider, "--model", MODEL, "--thinking", thinking, "--no-session",
                              "--mode", "json", "-p", PROMPT], PI_TIMEOUT)
    seconds = time.monotonic() - clock
    stderr = (workdir / "stderr.txt").read_text()
    assert status == 0, f"pi exited {status}: {stderr[-3000:]}"

    events = stdout_events(workdir)
    runs = [e for e in events if e["type"] == "tool_execution_end"]
    assert [(r["toolName"], r["isError"]) for r in runs] == [("bash", False)], runs
    assert MARKER in json.dumps(runs[0]["result"])  # pi really ran the command
    messages = next(e for e in events if e["type"] == "agent_end")["messages"]
    assistant = [m for m in messages if m["role"] == "assistant"]
    assert [m["stopReason"] for m in assistant] == ["toolUse", "stop"]
    assert all(m["api"] == api and m["provider"] == provider for m in assistant)
    assert f"printed {MARKER}" in assistant[-1]["content"][-1]["text"]

    first, second = (r.body for r in proxy.posts(path)[already:])
    assert MARKER not in json.dumps(first) and MARKER in json.dumps(second)  # turn 2 carries the tool's output
    if thinking != "off":
        assert reasoning_requested(api, first)
        thought = [b["thinking"] for b in assistant[0]["content"] if b["type"] == "thinking"]
        assert thought == [REASONING]
        assert replayed_reasoning(api, second) == [REASONING]  # the reasoning went back on turn 2

    turn1, turn2 = trace_records(records_path, started - 1, record_api, 2)
    assert turn1["finish_reason"] == "tool_calls" and turn2["finish_reason"] == "stop"
    if thinking != "off":
        assert turn1["reasoning_tokens"] > 0
    # turn 2's prompt starts with all of turn 1's: its cached tokens cover turn 1's prompt but its last blocks
    assert turn2["cached_tokens"] >= turn1["prompt_tokens"] - 2 * BLOCK, (turn1, turn2)
    figures = {"harness": "pi", "api": api, "thinking": thinking, "turn1_prompt": turn1["prompt_tokens"],
               "turn2_prompt": turn2["prompt_tokens"], "turn2_cached": turn2["cached_tokens"],
               "seconds": round(seconds, 1)}
    record_property("figures", json.dumps(figures))
    print(json.dumps(figures))
