"""``harnessmesh breaks``: a session's prefix breaks from a mesh's JSON log, one line each and a count per cause."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

from services.launcher.breaks_cmd import causes, read_breaks, run


def _line(session: str, cause: str, index: int = 1, role: str = "user") -> str:
    return json.dumps({"event": "parse.prefix_break", "session_id": session, "cause": cause, "message_index": index,
                       "message_role": role, "offset": 42, "history_tokens": 100, "in_output": False,
                       "expected": "a⟂b", "actual": "a⟂c", "level": "warning"})


LOG = "\n".join([
    "not json at all parse.prefix_break",
    json.dumps({"event": "parse.request_finished", "session_id": "s1"}),
    _line("s1", "message_edited"), _line("s1/agent-2", "tools_changed", -1, ""), _line("s2", "billing_line", 0),
])


def test_a_sessions_breaks_and_its_trajectories_are_kept() -> None:
    assert [b["cause"] for b in read_breaks(LOG.splitlines(), "s1")] == ["message_edited", "tools_changed"]
    assert causes(read_breaks(LOG.splitlines())) == {"message_edited": 1, "tools_changed": 1, "billing_line": 1}


def test_the_command_prints_each_break_and_the_counts(tmp_path: Path) -> None:
    log = tmp_path / "mesh.log"
    log.write_text(LOG)
    out = io.StringIO()
    assert run(argparse.Namespace(log=str(log), session="s1", json=False), out) == 0
    text = out.getvalue()
    assert "session s1: message_edited, message #1 (user), token 42 of 100" in text
    assert "session s1/agent-2: tools_changed, no message differs" in text
    assert text.rstrip().endswith("2 breaks: message_edited 1, tools_changed 1")
