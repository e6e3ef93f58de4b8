"""examples/agent_tool_loop.py runs a full tool loop against the gRPC edge."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from gateway.server import Gateway
from services.api import chat_pb2, common_pb2
from tests.gateway.fake_parse import FakeParse, batch, call_args, call_start, dispatch, finish, reasoning, started, text

ROOT = Path(__file__).resolve().parents[2]


def _respond(request: chat_pb2.ChatRequest) -> list[chat_pb2.ChatEventBatch]:
    if request.messages[-1].role == "tool":
        return [batch(started(), text("It is sunny in Paris.")), batch(finish())]
    args = '{"city": "Paris"}'
    return [
        batch(started(), reasoning("I should look it up.")),
        batch(call_start(0, "call_1", "get_weather"), call_args(0, args), dispatch(0, "call_1", "get_weather", args)),
        batch(finish(common_pb2.FINISH_REASON_TOOL_CALLS)),
    ]


async def test_agent_tool_loop(gateway: Gateway, fake: FakeParse) -> None:
    fake.responder = _respond
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "examples" / "agent_tool_loop.py"),
        "--target", gateway.grpc_address, "--prompt", "Weather in Paris?",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=ROOT,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == 0, err.decode()
    summary = json.loads(out.decode().strip().splitlines()[-1])
    assert summary == {
        "turns": 2, "tool_calls": 1, "final_text": "It is sunny in Paris.", "finish_reason": "FINISH_REASON_STOP"
    }
    second = fake.requests[1]
    assistant, tool = second.messages[-2], second.messages[-1]
    assert [p.WhichOneof("kind") for p in assistant.parts] == ["reasoning", "tool_call"]
    assert tool.role == "tool" and tool.tool_call_id == "call_1" and "sunny" in tool.parts[0].text
