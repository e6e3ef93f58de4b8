"""Real Codex CLI (the version in ``.ci/harnesses/clients.txt``) against the real mesh: a two-turn tool loop.

The mocker's script makes the model call Codex's shell tool (``exec_command`` with ``{"cmd": ...}``),
Codex runs the command and sends its output back (``function_call_output``), and the model answers.
Codex is configured with what ``harnessmesh catalog codex`` prints for this mesh (catalog and config.toml).

Runs only inside ``.ci/harnesses/offline.sh`` (``HARNESS_OFFLINE=1``): ``.ci/run`` runs the
``harness`` tests that way after the main suite.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.harness import (
    client_binary,
    configure_codex,
    offline_harness_marks,
    run_codex,
    scripted_mesh,
    stdout_events,
)
from tests.support.mesh import RunningMesh

MODEL = "mesh-coder"
MARKER = "harnessmesh-codex-ok"
PROMPT = "Run the greeting command and tell me what it printed."
CODEX_TIMEOUT = int(os.environ.get("CODEX_TIMEOUT", "90"))

TOOL_TURN = (
    "<think>\nThe user wants me to run the greeting command. I will use exec_command.\n</think>\n\n"
    '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "echo ' + MARKER + '"}}\n</tool_call>'
)
FINAL_TURN = f"<think>\nThe command succeeded.\n</think>\n\nThe greeting command printed {MARKER}."
# The script matches the last user/tool message: the prompt, then Codex's exec_command output.
SCRIPT = [{"match": MARKER, "completion": FINAL_TURN}, {"match": "greeting command", "completion": TOOL_TURN}]

pytestmark = offline_harness_marks("Codex")


@pytest.fixture(scope="module")
def codex_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningMesh]:
    client_binary("codex")  # skips before starting a mesh when it is not installed
    tmp = tmp_path_factory.mktemp("codex-mesh")
    with scripted_mesh(tmp, SCRIPT, MODEL) as mesh:
        yield mesh


def test_codex_runs_a_tool_loop_against_the_mesh(codex_mesh: RunningMesh, tmp_path: Path) -> None:
    workdir = tmp_path / "cx"
    catalog = configure_codex(codex_mesh.http, workdir)
    assert catalog["models"][0]["slug"] == MODEL
    status = run_codex(workdir, [PROMPT, "-c", "model_providers.harnessmesh.stream_max_retries=0"], CODEX_TIMEOUT)
    stderr = (workdir / "stderr.txt").read_text()
    mesh_log = codex_mesh.log_path.read_text()[-4000:]
    assert status == 0, f"codex exited {status}\n{stderr[-4000:]}\n{mesh_log}"

    events = stdout_events(workdir)
    items = [e["item"] for e in events if e["type"] == "item.completed"]
    runs = [i for i in items if i["type"] == "command_execution"]
    assert runs, items
    assert runs[0]["exit_code"] == 0 and runs[0]["aggregated_output"].strip() == MARKER
    assert MARKER in runs[0]["command"]
    messages = [i["text"] for i in items if i["type"] == "agent_message"]
    assert messages and MARKER in messages[-1]
    assert not [i for i in items if i["type"] == "error"], items
    last = events[-1]
    assert last["type"] == "turn.completed"
    # The second request's prompt starts with the first one's: the worker's prefix cache served it.
    assert last["usage"]["cached_input_tokens"] > 0, last
