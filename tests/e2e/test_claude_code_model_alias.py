"""Real Claude Code whose sub-agent's definition names a model the mesh does not serve: served through a pattern
alias alone, or with the environment ``harnessmesh catalog claude-code`` prints and no alias.

The project's ``.claude/agents/haiku-auditor.md`` says ``model: claude-haiku-4-5-20251001``; Claude Code gets
no model variable at all (no ``ANTHROPIC_MODEL``, no ``ANTHROPIC_DEFAULT_HAIKU_MODEL``, no
``CLAUDE_CODE_SUBAGENT_MODEL``), so every request names a model Claude Code chose itself, and the mesh serves
``mesh-model`` with just ``--model-alias 'claude-*=mesh-model'``. The mocker's script makes the main agent start
the sub-agent (its ``Agent`` tool); the sub-agent runs a ``Bash`` command and reports; the main agent answers
from the report. Without the pattern every one of those requests is a 404 (claude-code #92715).

Checked: the run succeeds with the sub-agent completed; each of the sub-agent's requests (a recording
pass-through keeps what Claude Code really sent) names ``claude-haiku-4-5-20251001``; the gateway's access
line of every ``/v1/messages`` request is a 200 with the requested name, ``model: mesh-model`` and
``model_alias: claude-*``. With the catalog's exports instead and a mesh without any alias, the same run names
only ``mesh-model``: a copy-paste setup never 404s. (Its ``CLAUDE_CODE_SUBAGENT_MODEL_FORCE=1`` is what makes
that so: Claude Code 2.1.330 otherwise sends the definition's own model, which the mesh answers 404.)

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
    API_KEY,
    RecordingProxy,
    catalog_output,
    client_binary,
    offline_harness_marks,
    run_claude_code,
    run_client,
    scripted_mesh,
    stdout_events,
)
from tests.support.mesh import RunningMesh

MODEL = "mesh-model"
SUBAGENT_MODEL = "claude-haiku-4-5-20251001"
PATTERN = "claude-*"
CC_TIMEOUT = float(os.environ.get("CC_TIMEOUT", "90"))
PROMPT = "Delegate the haiku audit to its sub-agent."
ARGS = ["-p", PROMPT, "--output-format", "stream-json", "--verbose", "--allowedTools", "Bash,Agent"]
# What run_claude_code adds to keep a run offline-clean beyond the catalog's CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC.
QUIET = {"DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1"}
AGENT = """---
name: haiku-auditor
description: Runs the haiku audit with Bash and reports its marker.
model: claude-haiku-4-5-20251001
tools: Bash
---
You run the audit you are given with Bash and report the marker it prints.
"""


def _call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


# First match wins, over the user and tool messages since the last assistant message: the main agent's final
# turn (the sub-agent's report), the sub-agent's second turn (its Bash output), its first turn (its task), the
# main agent's first turn (the prompt); anything else (none expected) answers "OK.".
SCRIPT = [
    {"match": "HM_REPORT_HAIKU", "completion": "The haiku audit is done: HM_REPORT_HAIKU."},
    {"match": "HM_HAIKU_RAN", "completion": "Haiku audit finished: HM_REPORT_HAIKU."},
    {"match": "HM_TASK_HAIKU", "completion": "Running the haiku check.\n" + _call(
        "Bash", {"command": "echo HM HAIKU RAN | tr ' ' _", "description": "Run the check"})},
    {"match": "Delegate", "completion": "Starting the haiku auditor.\n" + _call(
        "Agent", {"description": "Haiku audit", "prompt": "HM_TASK_HAIKU: run the haiku check with Bash.",
                  "subagent_type": "haiku-auditor", "run_in_background": False})},
    {"match": "", "completion": "OK."},
]

pytestmark = offline_harness_marks("Claude Code")


@pytest.fixture(scope="module")
def aliased_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningMesh, RecordingProxy]]:
    """The mesh serving ``mesh-model`` with one pattern alias, behind a recording pass-through."""
    client_binary("claude-code")  # skips before starting a mesh when it is not installed
    tmp = tmp_path_factory.mktemp("cc-alias")
    with scripted_mesh(tmp, SCRIPT, MODEL, ["--model-alias", f"{PATTERN}={MODEL}"]) as mesh, \
            RecordingProxy(mesh.http) as proxy:
        yield mesh, proxy


@pytest.fixture(scope="module")
def plain_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningMesh, RecordingProxy]]:
    """The same without any alias."""
    client_binary("claude-code")
    tmp = tmp_path_factory.mktemp("cc-plain")
    with scripted_mesh(tmp, SCRIPT, MODEL) as mesh, RecordingProxy(mesh.http) as proxy:
        yield mesh, proxy


def _access_lines(log: Path, path: str, since: int, count: int) -> list[dict[str, Any]]:
    """The gateway's access lines for ``path`` written after byte ``since`` of the mesh log, once there are
    ``count`` (a line is written as its response ends)."""
    deadline = time.monotonic() + 10
    while True:
        with log.open("rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        lines = [json.loads(line[line.index("{"):]) for line in text.splitlines()
                 if '"gateway.access"' in line and f'"{path}"' in line]
        if len(lines) >= count or time.monotonic() > deadline:
            assert len(lines) == count, lines
            return lines
        time.sleep(0.1)


def _project(workdir: Path) -> None:
    agents = workdir / "work" / ".claude" / "agents"
    agents.mkdir(parents=True)
    (agents / "haiku-auditor.md").write_text(AGENT)


def _sub_agent_completed(status: int, workdir: Path, proxy: RecordingProxy) -> tuple[list[Any], list[Any]]:
    """Assert the run delegated to the sub-agent and finished; the main agent's and the sub-agent's requests."""
    assert status == 0, f"claude exited {status}: {(workdir / 'stderr.txt').read_text()[-3000:]}"
    final = stdout_events(workdir)[-1]
    assert final["type"] == "result" and final["subtype"] == "success", final
    assert "HM_REPORT_HAIKU" in final["result"]
    stats = final["subagent_stats"]
    assert (stats["spawned"], stats["completed"], stats["failed"]) == (1, 1, 0), stats
    requests = proxy.posts("/v1/messages")
    sub = [r for r in requests if r.headers.get("x-claude-code-agent-id")]
    main = [r for r in requests if not r.headers.get("x-claude-code-agent-id")]
    assert len(sub) == 2 and len(main) >= 2, [(r.headers.get("x-claude-code-agent-id"), r.body["model"])
                                              for r in requests]
    return main, sub


def test_claude_code_sub_agent_naming_a_claude_model_resolves_through_a_pattern_alias(
    aliased_mesh: tuple[RunningMesh, RecordingProxy], tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    mesh, proxy = aliased_mesh
    workdir = tmp_path / "cc"
    _project(workdir)
    log_start = mesh.log_path.stat().st_size
    status = run_claude_code(proxy.url, None, workdir, ARGS, CC_TIMEOUT)  # no model variable at all
    main, sub = _sub_agent_completed(status, workdir, proxy)
    assert {r.body["model"] for r in sub} == {SUBAGENT_MODEL}  # the definition's name, as Claude Code sent it
    requests = main + sub
    asked = {r.body["model"] for r in requests}
    assert all(name.startswith("claude-") for name in asked), asked  # none is the served name: all made up

    lines = _access_lines(mesh.log_path, "/v1/messages", log_start, len(requests))
    assert {(e["status"], e["model"], e["model_alias"]) for e in lines} == {(200, MODEL, PATTERN)}, lines
    assert sorted(e["requested_model"] for e in lines) == sorted(r.body["model"] for r in requests)
    figures = {"requests": len(requests), "models_asked": sorted(asked)}
    record_property("figures", json.dumps(figures))
    print(json.dumps(figures))


def test_the_catalogs_claude_code_environment_needs_no_alias(
    plain_mesh: tuple[RunningMesh, RecordingProxy], tmp_path: Path
) -> None:
    mesh, proxy = plain_mesh
    exports = dict(line.removeprefix("export ").split("=", 1)
                   for line in catalog_output(proxy.url, "claude-code").splitlines() if line.startswith("export "))
    assert exports.pop("ANTHROPIC_API_KEY") == "$HARNESSMESH_API_KEY"  # the key stays out of the printed config
    workdir = tmp_path / "cc"
    _project(workdir)
    log_start = mesh.log_path.stat().st_size
    status = run_client(client_binary("claude-code"), ARGS, workdir,
                        {**exports, "ANTHROPIC_API_KEY": API_KEY, **QUIET}, CC_TIMEOUT)
    main, sub = _sub_agent_completed(status, workdir, proxy)
    assert {r.body["model"] for r in main + sub} == {MODEL}  # CLAUDE_CODE_SUBAGENT_MODEL beat the definition's
    lines = _access_lines(mesh.log_path, "/v1/messages", log_start, len(main + sub))
    assert {(e["status"], e["model"], e.get("model_alias")) for e in lines} == {(200, MODEL, None)}, lines
