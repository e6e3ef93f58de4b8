"""Real OpenClaw (the version in ``.ci/harnesses/clients.txt``, on the kit's node 24) against the real mesh:
a two-turn tool loop per API.

OpenClaw is configured only with what ``harnessmesh catalog openclaw`` prints, saved whole as
``~/.openclaw/openclaw.json`` (as the README says), and run headless with ``openclaw agent exec --json``;
``--model PROVIDER/MODEL`` picks the API by the catalog's provider. The mocker's script makes the model
think, then call OpenClaw's ``exec`` tool; OpenClaw runs it and sends its output back, followed by a user
message of its own runtime context (the script matches every user and tool message since the last
assistant message, so this turn is still recognised); the model answers. A recording pass-through
between OpenClaw and the gateway keeps what OpenClaw really sent: the second request carries the tool's
output and, on the API run with reasoning on (``--thinking high``), the first turn's reasoning replayed.
The mesh's trace records give each turn's cached tokens: turn 2 must reuse turn 1's prompt.

Runs only inside ``.ci/harnesses/offline.sh`` (``HARNESS_OFFLINE=1``), as ``.ci/run`` does.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import (
    WIRE_APIS,
    RecordingProxy,
    client_binary,
    configure_openclaw,
    offline_harness_marks,
    reasoning_requested,
    replayed_reasoning,
    run_openclaw,
    scripted_mesh,
    trace_records,
)

MODEL = "mesh-claw"
MARKER = "harnessmesh-openclaw-ok"  # the tool's output; the command itself does not contain it
PROMPT = "Run the greeting command and tell me what it printed."
OPENCLAW_TIMEOUT = float(os.environ.get("OPENCLAW_TIMEOUT", "90"))
REASONING = "The user wants the greeting command. I will use exec."
TOOL_TURN = (f"<think>\n{REASONING}\n</think>\n\n"
             '<tool_call>\n{"name": "exec", "arguments": {"command": "echo harnessmesh openclaw ok | tr \' \' -"}}\n'
             "</tool_call>")
FINAL_TURN = f"<think>\nThe command succeeded.\n</think>\n\nThe greeting command printed {MARKER}."
SCRIPT = [{"match": MARKER, "completion": FINAL_TURN}, {"match": "greeting command", "completion": TOOL_TURN}]
THINKING = {"openai-responses": "high"}  # reasoning on for one API; "off" for the others

CONTEXT_TAG = "OPENCLAW_INTERNAL_CONTEXT"  # in the runtime-context user message OpenClaw appends to each request
CONTEXT_ALLOWANCE = 256  # tokens of turn 1's prompt turn 2 may not repeat: that message, the generation prompt

pytestmark = offline_harness_marks("OpenClaw")


def _plain(value: Any) -> Any:
    """``value`` without ``cache_control`` markers (clients move them to the newest message each turn)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _shared_and_dropped(first: dict[str, Any], second: dict[str, Any]) -> tuple[int, list[Any]]:
    """How many conversation items (``messages`` or ``input``) turn 2 repeats from the start of turn 1's, and the
    items of turn 1 it does not repeat."""
    key = "messages" if "messages" in first else "input"
    one, two = _plain(first[key]), _plain(second[key])
    shared = next((i for i, (a, b) in enumerate(zip(one, two, strict=False)) if a != b), min(len(one), len(two)))
    return shared, one[shared:]


@pytest.fixture(scope="module")
def claw_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RecordingProxy, Path]]:
    """The mesh behind a recording pass-through; yields (proxy, trace records file)."""
    client_binary("openclaw")  # skips before starting a mesh when it is not installed
    tmp = tmp_path_factory.mktemp("openclaw-mesh")
    records = tmp / "records.jsonl"
    with scripted_mesh(tmp, SCRIPT, MODEL, ["--trace-records", str(records)]) as mesh, \
            RecordingProxy(mesh.http) as proxy:
        yield proxy, records


@pytest.mark.parametrize("api", list(WIRE_APIS))
def test_openclaw_runs_a_tool_loop_over_each_api(claw_mesh: tuple[RecordingProxy, Path], api: str, tmp_path: Path,
                                                 record_property: Callable[[str, object], None]) -> None:
    proxy, records_path = claw_mesh
    provider, path, record_api = WIRE_APIS[api]
    workdir = tmp_path / "claw"
    config = configure_openclaw(proxy.url, workdir)
    assert config["models"]["providers"][provider]["api"] == api
    assert config["agents"]["defaults"]["model"]["primary"] == f"harnessmesh/{MODEL}"
    thinking = THINKING.get(api, "off")
    already, started, clock = len(proxy.posts(path)), time.time(), time.monotonic()
    status = run_openclaw(workdir, ["agent", "exec", "--json", "--model", f"{provider}/{MODEL}",
                                    "--thinking", thinking, PROMPT], OPENCLAW_TIMEOUT)
    seconds = time.monotonic() - clock
    stderr = (workdir / "stderr.txt").read_text()
    stdout = (workdir / "stdout.txt").read_text()
    assert status == 0, f"openclaw exited {status}: {stdout[-2000:]}\n{stderr[-3000:]}"

    result = json.loads(stdout)
    assert result["ok"] is True and result["status"] == "ok", result
    assert (result["provider"], result["model"]) == (provider, MODEL)
    assert result["toolSummary"]["tools"] == ["exec"] and result["toolSummary"]["failures"] == 0
    assert result["assistantTurns"] == 2
    assert f"printed {MARKER}" in result["final"]

    first, second = (r.body for r in proxy.posts(path)[already:])
    assert MARKER not in json.dumps(first) and MARKER in json.dumps(second)  # OpenClaw really ran the command
    if thinking != "off":
        assert reasoning_requested(api, first)
        assert replayed_reasoning(api, second) == [REASONING]  # the reasoning went back on turn 2

    turn1, turn2 = trace_records(records_path, started - 1, record_api, 2)
    assert turn1["finish_reason"] == "tool_calls" and turn2["finish_reason"] == "stop"
    if thinking != "off":
        assert turn1["reasoning_tokens"] > 0
    # OpenClaw ends every request with a user message of its runtime context and moves it to the end again on
    # the next turn: turn 2 repeats turn 1's conversation up to that message, so its cached tokens cover turn 1's
    # prompt but that message (~170 tokens) and the last partial blocks.
    shared, dropped = _shared_and_dropped(first, second)
    assert shared >= 1 and all(CONTEXT_TAG in json.dumps(item) for item in dropped), dropped
    assert turn2["cached_tokens"] >= turn1["prompt_tokens"] - CONTEXT_ALLOWANCE, (turn1, turn2)
    figures = {"harness": "openclaw", "api": api, "thinking": thinking, "turn1_prompt": turn1["prompt_tokens"],
               "turn2_prompt": turn2["prompt_tokens"], "turn2_cached": turn2["cached_tokens"],
               "seconds": round(seconds, 1)}
    record_property("figures", json.dumps(figures))
    print(json.dumps(figures))
