"""Real Claude Code starting sub-agents (its ``Agent`` tool) against the real mesh, traced over real OTLP.

The mocker's script makes the main agent launch two sub-agents at once (two ``Agent`` calls in one turn,
in the foreground); each sub-agent runs a ``Bash`` command and reports; the main agent answers from
their reports. A recording pass-through between Claude Code and the gateway keeps the headers Claude
Code really sent. What Claude Code 2.1.330 sends (asserted below): every request carries the session's
``X-Claude-Code-Session-Id``; a sub-agent's requests add its own ``X-Claude-Code-Agent-Id`` (no parent
header; ``cc_is_subagent=true`` in the billing line). So each sub-agent is its own trajectory in the
parent's session, whose parent trajectory is the main agent's (the session: ``gateway/identity.py``).

Checked on the spans every process exported: each request is one trace whose every span carries the
session id and the request's trajectory id; a sub-agent's turns carry ``trajectory.parent_id`` (the
parent/child link), and a sub-agent's second turn links to its first.

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
    RecordingProxy,
    client_binary,
    offline_harness_marks,
    run_claude_code,
    scripted_mesh,
    stdout_events,
    trace_records,
)
from tests.support.otlp import Collector, ReceivedSpan, running_collector

MODEL = "mesh-sonnet"
CC_TIMEOUT = float(os.environ.get("CC_TIMEOUT", "90"))
PROMPT = "Delegate the two audits to sub-agents."
SERVICES = {"harnessmesh-gateway", "harnessmesh-parse", "harnessmesh-router", "harnessmesh-worker"}


def _call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _agent(description: str, task: str) -> str:
    return _call("Agent", {"description": description, "prompt": task, "subagent_type": "general-purpose",
                           "run_in_background": False})


def _bash(marker: str) -> str:  # prints the marker without containing it: "HM ALPHA RAN" -> HM_ALPHA_RAN
    return _call("Bash", {"command": f"echo {marker.replace('_', ' ')} | tr ' ' _", "description": "Run the check"})


# First match wins, over the user and tool messages since the last assistant message: the main agent's final
# turn (its tool results hold both reports), each sub-agent's second turn (its Bash output), each sub-agent's
# first turn (its task), the main agent's first turn (the prompt); anything else (none expected) answers "OK.".
SCRIPT = [
    {"match": "HM_REPORT_", "completion": "<think>\nBoth sub-agents reported.\n</think>\n\n"
                                          "Both audits are done: HM_REPORT_ALPHA and HM_REPORT_BETA."},
    {"match": "HM_ALPHA_RAN", "completion": "Alpha audit finished: HM_REPORT_ALPHA."},
    {"match": "HM_BETA_RAN", "completion": "Beta audit finished: HM_REPORT_BETA."},
    {"match": "HM_TASK_ALPHA", "completion": "Running the alpha check.\n" + _bash("HM_ALPHA_RAN")},
    {"match": "HM_TASK_BETA", "completion": "Running the beta check.\n" + _bash("HM_BETA_RAN")},
    {"match": "Delegate", "completion": "<think>\nTwo independent audits: one sub-agent each.\n</think>\n\n"
                                        "Starting two sub-agents.\n"
                                        + _agent("Alpha audit", "HM_TASK_ALPHA: run the alpha check with Bash.")
                                        + "\n" + _agent("Beta audit", "HM_TASK_BETA: run the beta check with Bash.")},
    {"match": "", "completion": "OK."},
]

pytestmark = offline_harness_marks("Claude Code")


@pytest.fixture(scope="module")
def traced_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RecordingProxy, Collector, Path]]:
    """The mesh exporting spans to an in-test collector, behind a recording pass-through."""
    client_binary("claude-code")  # skips before starting a mesh when it is not installed
    tmp = tmp_path_factory.mktemp("cc-subagents")
    records = tmp / "records.jsonl"
    with running_collector() as (endpoint, collector):
        otel = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_BSP_SCHEDULE_DELAY": "100"}
        with scripted_mesh(tmp, SCRIPT, MODEL, ["--trace-records", str(records)], env=otel) as mesh, \
                RecordingProxy(mesh.http) as proxy:
            yield proxy, collector, records


def _traces(collector: Collector, session: str, count: int) -> dict[str, list[ReceivedSpan]]:
    """The ``count`` traces of ``session`` (root span's trace id -> spans), once each has all four services'."""
    deadline = time.monotonic() + 20
    while True:
        spans = collector.snapshot()
        roots = {s.trace_id for s in spans if not s.parent_span_id and s.attributes.get("session.id") == session}
        traces = {t: [s for s in spans if s.trace_id == t] for t in roots}
        complete = len(traces) == count and all({s.service for s in tree} >= SERVICES for tree in traces.values())
        if complete or time.monotonic() > deadline:
            assert complete, {t: sorted({s.service for s in tree}) for t, tree in traces.items()}
            time.sleep(0.5)  # stragglers of the same batch
            spans = collector.snapshot()
            return {t: [s for s in spans if s.trace_id == t] for t in roots}
        time.sleep(0.1)


def test_claude_code_sub_agents_are_traced_as_child_trajectories(
    traced_mesh: tuple[RecordingProxy, Collector, Path], tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    proxy, collector, records_path = traced_mesh
    workdir = tmp_path / "cc"
    started, clock = time.time(), time.monotonic()
    status = run_claude_code(proxy.url, MODEL, workdir, ["-p", PROMPT, "--output-format", "stream-json",
                                                         "--verbose", "--allowedTools", "Bash,Agent"], CC_TIMEOUT)
    seconds = time.monotonic() - clock
    assert status == 0, f"claude exited {status}: {(workdir / 'stderr.txt').read_text()[-3000:]}"
    final = stdout_events(workdir)[-1]
    assert final["type"] == "result" and final["subtype"] == "success", final
    assert "HM_REPORT_ALPHA and HM_REPORT_BETA" in final["result"]
    stats = final["subagent_stats"]
    assert (stats["spawned"], stats["completed"], stats["failed"]) == (2, 2, 0), stats
    session = final["session_id"]

    # What real Claude Code sent: the session on every request, an agent id on each sub-agent's.
    requests = proxy.posts("/v1/messages")
    assert {r.headers.get("x-claude-code-session-id") for r in requests} == {session}
    by_agent: dict[str, list[Any]] = {}
    for r in requests:
        by_agent.setdefault(r.headers.get("x-claude-code-agent-id", ""), []).append(r)
    main = by_agent.pop("")
    assert len(main) == 2 and len(by_agent) == 2 and all(len(turns) == 2 for turns in by_agent.values()), \
        {agent: len(turns) for agent, turns in by_agent.items()}
    subagent_headers = {k: v for k, v in next(iter(by_agent.values()))[0].headers.items()
                        if k.startswith("x-claude-code") or k in ("user-agent", "x-app")}
    assert "x-claude-code-parent-agent-id" not in subagent_headers  # Claude Code 2.1.330 sends no parent header
    for turns in by_agent.values():
        assert "cc_is_subagent=true" in turns[0].body["system"][0]["text"]
    record_property("subagent_headers", json.dumps(subagent_headers))

    # The mesh's view: one trace per request; every span carries the session and its trajectory.
    traces = _traces(collector, session, len(requests))
    trajectories: dict[str, list[list[ReceivedSpan]]] = {}
    for tree in traces.values():
        (trajectory,) = {s.attributes.get("trajectory.id") for s in tree}
        assert {s.attributes.get("session.id") for s in tree} == {session}
        assert {s.attributes.get("harness.name") for s in tree} == {"claude-code"}
        trajectories.setdefault(str(trajectory), []).append(sorted(tree, key=lambda s: s.start_ns))
    assert set(trajectories) == {session, *by_agent}  # the main agent's trajectory is the session
    for agent in by_agent:
        turns = sorted(trajectories[agent], key=lambda tree: tree[0].start_ns)
        parents = {s.attributes.get("trajectory.parent_id") for tree in turns for s in tree} - {None}
        assert parents == {session}, parents  # the parent/child link
        first_root, second_root = (next(s for s in tree if not s.parent_span_id) for tree in turns)
        assert (first_root.trace_id, first_root.span_id) in second_root.links  # turn 2 follows turn 1
    for tree in trajectories[session]:
        assert not any(s.attributes.get("trajectory.parent_id") for s in tree)

    records = trace_records(records_path, started - 1, "anthropic", len(requests))
    assert {(r["trajectory_id"], r["parent_trajectory_id"]) for r in records} == \
        {(session, ""), *((agent, session) for agent in by_agent)}
    figures = {"seconds": round(seconds, 1), "requests": len(requests),
               "subagent_first_turn_cached": sorted(r["cached_tokens"] for r in records
                                                    if r["parent_trajectory_id"] and not r["tool_results"]),
               "subagent_first_turn_prompt": sorted(r["prompt_tokens"] for r in records
                                                    if r["parent_trajectory_id"] and not r["tool_results"])}
    record_property("figures", json.dumps(figures))
    print(json.dumps({"headers": subagent_headers, **figures}))
