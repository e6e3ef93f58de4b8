"""The gateway's access line: one per HTTP request, with the turn's identity and usage whatever the sampler
decided, and never the prompt."""

from __future__ import annotations

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider, sampling
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.parse_client import ParseClient
from gateway.settings import GatewaySettings
from gateway.turn_tracking import TurnTracker
from services.api import chat_pb2
from services.common.grpc_util import open_channel
from tests.gateway.fake_parse import FakeParse, batch, finish, started, text, usage

SECRET = "the secret prompt text"


def _responder(request: chat_pb2.ChatRequest) -> list[chat_pb2.ChatEventBatch]:
    return [batch(started(900, 512), text("done")), batch(finish(), usage(900, 5, 512))]


@pytest.mark.parametrize("sampler", [sampling.ALWAYS_ON, sampling.ALWAYS_OFF], ids=["sampled", "unsampled"])
async def test_one_access_line_per_request_with_identity_and_tokens(
        fake_parse: tuple[FakeParse, str], sampler: sampling.Sampler) -> None:
    fake_parse[0].responder = _responder
    tracer = TracerProvider(sampler=sampler).get_tracer("t")
    channel = open_channel(fake_parse[1], None)
    app = create_app(ParseClient(channel, turns=TurnTracker(tracer)), GatewaySettings(), tracer)
    body = {"model": "demo", "stream": True, "messages": [{"role": "user", "content": SECRET}]}
    headers = {"x-session-id": "S", "x-trajectory-id": "T"}
    with capture_logs() as logs:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            turn = await http.post("/v1/chat/completions", json=body, headers=headers)
            missing = await http.get("/v1/nothing-here")
            probe = await http.get("/health")
    await channel.close()
    assert (turn.status_code, missing.status_code, probe.status_code) == (200, 404, 200)

    access = [entry for entry in logs if entry["event"] == "gateway.access"]
    lines = [entry for entry in access if entry["log_level"] == "info"]
    assert [(e["method"], e["path"], e["status"]) for e in lines] == [
        ("POST", "/v1/chat/completions", 200), ("GET", "/v1/nothing-here", 404)]
    # probes log at debug level (seen only when the process's level lets debug through)
    assert all(e["log_level"] == "debug" for e in access if e["path"] == "/health")
    chat = lines[0]
    assert chat["request_id"].startswith("chatcmpl-") and chat["request_id"] in turn.text
    assert (chat["session_id"], chat["trajectory_id"]) == ("S", "T")
    assert (chat["prompt_tokens"], chat["completion_tokens"], chat["cached_tokens"]) == (900, 5, 512)
    assert chat["duration_ms"] > 0
    assert lines[1]["request_id"].startswith("req_") and "prompt_tokens" not in lines[1]
    assert SECRET not in repr(logs)
