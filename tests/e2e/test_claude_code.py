"""Real Claude Code CLI (the version in ``.ci/harnesses/clients.txt``) against the real mesh: a tool loop.

The mocker's script makes the model think, then call Claude Code's ``Bash`` tool with
``{"command": ..., "description": ...}``; Claude Code runs the command and sends a ``tool_result``;
the model answers. The second turn must be a prefix-cache hit (``cache_read_input_tokens`` > 0 in
its usage) and the parse service must report no prefix break for the session (the billing header
is stripped by default).

Runs only inside ``.ci/harnesses/offline.sh`` (``HARNESS_OFFLINE=1``): ``.ci/run`` runs the
``harness`` tests that way after the main suite.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.harness import client_binary, offline_harness_marks, run_claude_code, scripted_mesh, stdout_events
from tests.support.mesh import RunningMesh

MODEL = "mesh-sonnet"
MARKER = "HARNESSMESH_CC_OK"
PROMPT = "Run the marker command and tell me what it printed."
CC_TIMEOUT = float(os.environ.get("CC_TIMEOUT", "90"))

TOOL_TURN = (
    "<think>\nThe user wants me to run the marker command. I will use Bash.\n</think>\n\n"
    "Running the marker command.\n"
    '<tool_call>\n{"name": "Bash", "arguments": {"command": "echo ' + MARKER + '", '
    '"description": "Print the marker"}}\n</tool_call>'
)
FINAL_TURN = f"<think>\nThe command succeeded.\n</think>\n\nThe marker command printed {MARKER}."
# The script matches the last user/tool message: Claude Code's tool_result, then the prompt.
SCRIPT = [{"match": MARKER, "completion": FINAL_TURN}, {"match": "marker command", "completion": TOOL_TURN},
          {"match": "", "completion": "OK."}]

pytestmark = offline_harness_marks("Claude Code")


@pytest.fixture(scope="module")
def cc_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningMesh]:
    client_binary("claude-code")  # skips before starting a mesh when it is not installed
    tmp = tmp_path_factory.mktemp("cc-mesh")
    # Claude Code asks for max_tokens=32000 on a ~27k-token prompt: the parse service clamps the cap to
    # the room the demo model's 32,768-token context leaves.
    with scripted_mesh(tmp, SCRIPT, MODEL) as mesh:
        yield mesh


def test_claude_code_runs_a_bash_tool_loop(cc_mesh: RunningMesh, tmp_path: Path) -> None:
    workdir = tmp_path / "cc"
    status = run_claude_code(cc_mesh.http, MODEL, workdir, ["-p", PROMPT, "--output-format", "stream-json",
                                                           "--verbose", "--allowedTools", "Bash"], CC_TIMEOUT)
    stderr = (workdir / "stderr.txt").read_text()
    assert status == 0, f"claude exited {status}: {stderr[-3000:]}"
    events = stdout_events(workdir)
    assistant = [e["message"] for e in events if e["type"] == "assistant"]
    calls = [b for m in assistant for b in m["content"] if b["type"] == "tool_use"]
    results = [b for e in events if e["type"] == "user" for b in e["message"]["content"] if b["type"] == "tool_result"]
    assert [(c["name"], c["input"]["command"]) for c in calls] == [("Bash", f"echo {MARKER}")]
    assert results and results[0]["tool_use_id"] == calls[0]["id"] and results[0]["is_error"] is False
    assert MARKER in str(results[0]["content"])  # Claude Code really ran the command
    final = events[-1]
    assert final["type"] == "result" and final["subtype"] == "success" and final["num_turns"] == 2
    assert f"printed {MARKER}" in final["result"]
    thinking = [b for m in assistant for b in m["content"] if b["type"] == "thinking"]
    assert thinking and thinking[0]["thinking"].startswith("The user wants me")
    # The second turn (a different message id) extends the first: its prompt is a prefix-cache hit.
    ids = list(dict.fromkeys(m["id"] for m in assistant))
    assert len(ids) == 2
    second = next(m for m in assistant if m["id"] == ids[1])
    assert second["usage"]["cache_read_input_tokens"] > 0
    log = cc_mesh.log_path.read_text()
    session = next(e["session_id"] for e in events if e.get("session_id"))
    breaks = [line for line in log.splitlines() if "parse.prefix_break" in line and session in line]
    assert breaks == []
