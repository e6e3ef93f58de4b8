"""Every Responses request recorded from real clients (``tests/fixtures/captures``) gets a valid stream.

The bodies are sent as recorded (headers included, model renamed to the served one) to the gateway
over a fake parse service; every SSE event must parse as the openai SDK's typed stream event, and
the stream must end in ``response.completed``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.server import Gateway
from services.api import common_pb2
from tests.gateway.fake_parse import (
    FakeParse,
    batch,
    call_args,
    call_start,
    dispatch,
    finish,
    reasoning,
    started,
    usage,
)
from tests.support.fixtures import CAPTURES

_DROP_HEADERS = {"host", "content-length", "authorization", "accept-encoding", "connection"}
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def captured_requests() -> list[tuple[str, dict[str, Any]]]:
    """(name, request) for every recorded ``POST /v1/responses``."""
    out = []
    for path in sorted(CAPTURES.glob("*.json")):
        data = json.loads(path.read_text())
        requests = data.get("requests") or [data]
        for i, req in enumerate(requests):
            if req.get("method") == "POST" and str(req.get("path", "")).split("?")[0] == "/v1/responses":
                out.append((f"{path.stem}#{i}", req))
    return out


CASES = captured_requests()


def parse_sse(raw: str) -> list[dict[str, Any]]:
    events = []
    for block in raw.split("\n\n"):
        data = [line[6:] for line in block.splitlines() if line.startswith("data: ")]
        kind = [line[7:] for line in block.splitlines() if line.startswith("event: ")]
        if data:
            event = json.loads("".join(data))
            assert kind == [event["type"]], block
            events.append(event)
    return events


def test_the_captures_are_in_the_repository() -> None:
    """Every Codex 0.169.0 / 0.171.0 and SDK Responses request recorded (a missing fixture fails, never skips)."""
    assert len(CASES) == 17, [name for name, _ in CASES]


@pytest.mark.parametrize("name", [name for name, _ in CASES])
async def test_captured_request_gets_a_valid_stream(name: str, gateway: Gateway, fake: FakeParse) -> None:
    request = dict(CASES)[name]
    body = dict(request["body"])
    body["model"] = "demo"
    body["stream"] = True
    headers = {k: v for k, v in request["headers"].items() if k.lower() not in _DROP_HEADERS}
    tool = next((t.get("name") for t in body.get("tools") or [] if t.get("type") == "function"), None)
    fake.script = [batch(started(100, 32), reasoning("Let me look."))]
    if tool:
        fake.script.append(batch(call_start(0, "call_1", tool), call_args(0, "{}"), dispatch(0, "call_1", tool, "{}")))
    fake.script.append(batch(finish(common_pb2.FINISH_REASON_TOOL_CALLS if tool else common_pb2.FINISH_REASON_STOP),
                             usage(100, 9, 32)))
    async with httpx.AsyncClient(base_url=gateway.http_url, timeout=20) as http:
        reply = await http.post("/v1/responses", json=body, headers=headers)
    assert reply.status_code == 200, reply.text
    events = parse_sse(reply.text)
    for event in events:
        EVENTS.validate_python(event)
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    final = events[-1]["response"]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert final["output"] == done
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == 32
    sent = fake.requests[-1]
    assert sent.messages, name
    if "thread-id" in request["headers"]:
        assert sent.identity.session_id == request["headers"]["thread-id"]
        assert sent.identity.harness == "codex"
    if body["input"][-1] == {"type": "compaction_trigger"}:  # Codex's remote compaction: exactly one item
        assert [d["type"] for d in done] == ["compaction"], done
    elif tool:
        assert done[-1]["type"] == "function_call" and done[-1]["name"] == tool
