"""Every recorded Responses request (``shared/harnesses/captures``) through the real mesh.

Unlike ``tests/gateway/test_responses_replay.py`` this renders each request with the demo model's
real chat template (developer messages, namespace and custom tools, replayed reasoning and
function calls), routes it to a mocker worker and checks the typed stream that comes back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.gateway.test_responses_replay import _DROP_HEADERS, CASES, EVENTS, parse_sse
from tests.support.mesh import RunningMesh, running_mesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
ANSWER = "<think>\nThe request was replayed.\n</think>\n\nDone."


@pytest.fixture(scope="module")
def replay_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningMesh]:
    """One mocker worker that answers every request with a short reasoned text turn."""
    tmp = tmp_path_factory.mktemp("replay-mesh")
    script = tmp / "script.jsonl"
    script.write_text(json.dumps({"match": "", "completion": ANSWER}) + "\n")
    args = ["--workers", "1", "--speedup", "50", "--script", str(script), "--reasoning-parser", "qwen3",
            "--tool-parser", "hermes", "--served-model-name", "demo", "--block-size", "16"]
    with running_mesh(args, tmp / "mesh.log") as mesh:
        yield mesh


@pytest.mark.skipif(not CASES, reason="no captures under shared/harnesses/captures")
async def test_every_captured_request_streams_to_completion(replay_mesh: RunningMesh) -> None:
    async with httpx.AsyncClient(base_url=replay_mesh.http, timeout=60) as http:
        for name, request in CASES:
            body = {**request["body"], "model": "demo", "stream": True}
            headers = {k: v for k, v in request["headers"].items() if k.lower() not in _DROP_HEADERS}
            reply = await http.post("/v1/responses", json=body, headers=headers)
            assert reply.status_code == 200, (name, reply.text[:2000])
            events = parse_sse(reply.text)
            for event in events:
                EVENTS.validate_python(event)
            assert events[-1]["type"] == "response.completed", (name, events[-1])
            usage = events[-1]["response"]["usage"]
            assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0, name
            output = events[-1]["response"]["output"]
            assert [o["type"] for o in output] == ["reasoning", "message"], name
            assert output[1]["content"][0]["text"] == "Done."
