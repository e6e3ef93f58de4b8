"""Every real-harness capture in ``tests/fixtures/captures`` replayed through the real mesh, as recorded and with
causes injected into its later turns: each prefix break the parse service reports is explained, ``unknown``
stays under 2 % of them, and ``harnessmesh breaks`` shows them per session (issue 34)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.launcher.breaks_cmd import causes, read_breaks
from tests.support.fixtures import CAPTURES
from tests.support.mesh import RunningMesh, running_mesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CHAT_PATHS = ("/v1/messages", "/v1/chat/completions", "/v1/responses")
DROP = {"host", "content-length", "authorization", "accept-encoding", "connection"}
SESSION_HEADERS = ("x-claude-code-session-id", "x-session-id", "session_id", "session-id", "conversation_id",
                   "thread-id")


def sessions() -> list[tuple[str, list[dict[str, Any]]]]:
    """(capture, one session's chat requests in order) for every session of every capture with a chat request (a
    capture may hold several sessions: Codex's compaction capture has a local and a remote one)."""
    out = []
    for path in sorted(CAPTURES.glob("*.json")):
        data = json.loads(path.read_text())
        requests = data.get("requests") or ([data] if "body" in data else [])
        chats = [r for r in requests if r.get("method") == "POST" and r["path"].split("?")[0] in CHAT_PATHS
                 and isinstance(r.get("body"), dict)]
        by_session: dict[str, list[dict[str, Any]]] = {}
        for request in chats:
            by_session.setdefault(session_of(request, ""), []).append(request)
        out.extend((path.stem, session_chats) for session_chats in by_session.values())
    return out


def edit_first_user(body: dict[str, Any]) -> bool:
    """Inject ``message_edited``: change the first user message's text (False: no such message)."""
    for message in body.get("messages") or body.get("input") or []:
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                message["content"] = "EDITED " + content
                return True
            for block in content or []:
                if isinstance(block, dict) and isinstance(block.get("text"), str):
                    block["text"] = "EDITED " + block["text"]
                    return True
    return False


def change_tools(body: dict[str, Any]) -> bool:
    """Inject ``tools_changed``: change the first tool's description (False: no tools)."""
    tools = body.get("tools") or []
    if not tools or not isinstance(tools[0], dict):
        return False
    target = tools[0].get("function", tools[0])
    target["description"] = "CHANGED " + str(target.get("description", ""))
    return True


INJECTIONS = {"message_edited": edit_first_user, "tools_changed": change_tools}


@pytest.fixture(scope="module")
def replay_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningMesh]:
    tmp = tmp_path_factory.mktemp("break-replay")
    script = tmp / "script.jsonl"
    script.write_text(json.dumps({"match": "", "completion": "<think>\nReplayed.\n</think>\n\nDone."}) + "\n")
    args = ["--workers", "1", "--speedup", "50", "--script", str(script), "--reasoning-parser", "qwen3",
            "--tool-parser", "hermes", "--served-model-name", "demo", "--block-size", "16"]
    with running_mesh(args, tmp / "mesh.log") as mesh:
        yield mesh


def session_of(request: dict[str, Any], variant: str) -> str:
    """The capture's own session id, made the variant's (requests recorded without one stay anonymous)."""
    for k, v in request["headers"].items():
        if k.lower() in SESSION_HEADERS:
            return f"{v}-{variant}"
    return ""


async def send(http: httpx.AsyncClient, request: dict[str, Any], variant: str, body: dict[str, Any]) -> str:
    headers = {k: v for k, v in request["headers"].items() if k.lower() not in DROP}
    headers = {k: (f"{v}-{variant}" if k.lower() in SESSION_HEADERS else v) for k, v in headers.items()}
    body = {**body, "model": "demo", "stream": False}
    if isinstance(body.get("prompt_cache_key"), str):
        body["prompt_cache_key"] = f"{body['prompt_cache_key']}-{variant}"
    user_id = body.get("metadata", {}).get("user_id") if isinstance(body.get("metadata"), dict) else None
    if isinstance(user_id, str) and user_id.startswith("{"):
        ids = json.loads(user_id)
        ids["session_id"] = f"{ids.get('session_id', '')}-{variant}"
        body["metadata"] = {**body["metadata"], "user_id": json.dumps(ids)}
    await http.post(request["path"].split("?")[0], json=body, headers=headers)
    return session_of(request, variant)


async def test_captured_sessions_with_causes_injected_have_their_breaks_explained(
    replay_mesh: RunningMesh, capsys: pytest.CaptureFixture[str]
) -> None:
    expected: dict[str, str] = {}  # session -> the cause injected into its last turn
    async with httpx.AsyncClient(base_url=replay_mesh.http, timeout=60) as http:
        for _capture, chats in sessions():
            for variant in ("as_recorded", *INJECTIONS):
                for turn, request in enumerate(chats):
                    body = copy.deepcopy(request["body"])
                    injected = variant != "as_recorded" and turn == len(chats) - 1 > 0 and INJECTIONS[variant](body)
                    session = await send(http, request, variant, body)
                    if injected and session:
                        expected[session] = variant
    breaks = read_breaks(Path(replay_mesh.log_path).read_text().splitlines())  # noqa: ASYNC240 - after the run
    counted = causes(breaks)
    assert breaks, "no break at all: the replay did not run"
    unknown = counted["unknown"] / len(breaks)
    with capsys.disabled():
        print(f"\nreplayed captures: {len(breaks)} breaks, causes {dict(counted)}, unknown {unknown:.1%}")
    assert unknown < 0.02, dict(counted)
    named = {str(b["session_id"]): b["cause"] for b in breaks}  # a session's last break
    for session, cause in expected.items():
        assert named.get(session) == cause, (session, named.get(session))
