"""KV-aware placement across two real workers, and cancellation through every hop."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import grpc
import httpx
import nats
import pytest

from services.api import chat_pb2, chat_pb2_grpc, kv_pb2
from services.common import subjects
from tests.support.mesh import RunningMesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
REPO = Path(__file__).resolve().parents[2]


def conversation(topic: int, question: str) -> chat_pb2.ChatRequest:
    # A long, topic-specific system prompt: many full KV blocks that only this topic shares.
    system = f"Project {topic} notes: " + " ".join(f"fact {topic}-{i} holds." for i in range(60))
    return chat_pb2.ChatRequest(
        model="demo",
        messages=[
            chat_pb2.Message(role="system", parts=[chat_pb2.Part(text=system)]),
            chat_pb2.Message(role="user", parts=[chat_pb2.Part(text=question)]),
        ],
        sampling={"max_tokens": 8},
    )


async def started_of(stub: chat_pb2_grpc.AgentServiceStub, request: chat_pb2.ChatRequest) -> chat_pb2.Started:
    started = None
    async for batch in stub.Chat(request):
        for event in batch.events:
            if event.WhichOneof("event") == "started":
                started = event.started
            assert event.WhichOneof("event") != "error", event.error.message
    assert started is not None
    return started


async def test_repeated_prefixes_land_on_the_worker_holding_them(mesh: RunningMesh) -> None:
    async with grpc.aio.insecure_channel(mesh.grpc) as channel:
        stub = chat_pb2_grpc.AgentServiceStub(channel)
        topics = range(6)
        # Concurrent first turns: the router spreads them by load.
        firsts = await asyncio.gather(*(started_of(stub, conversation(t, "Summarise.")) for t in topics))
        assert {s.worker_id for s in firsts} == {"worker-0", "worker-1"}
        await asyncio.sleep(0.5)  # let the workers' KV events reach the router over NATS
        for topic, first in zip(topics, firsts, strict=True):
            again = await started_of(stub, conversation(topic, "Now list the facts."))
            assert again.worker_id == first.worker_id, f"topic {topic} moved workers"
            assert again.cached_tokens >= 16 * 10


async def heartbeat_counts(nats_url: str, seconds: float, token: str) -> dict[str, int]:
    nc = await nats.connect(nats_url, token=token)
    counts: dict[str, int] = {}

    async def on_beat(msg: object) -> None:
        beat = kv_pb2.WorkerHeartbeat.FromString(msg.data)  # type: ignore[attr-defined]
        counts[beat.info.worker_id] = beat.active_requests

    sub = await nc.subscribe(subjects.heartbeat("default"), cb=on_beat)
    await asyncio.sleep(seconds)
    await sub.unsubscribe()
    await nc.close()
    return counts


async def test_client_disconnect_frees_the_worker_request(mesh: RunningMesh) -> None:
    body = {"model": "demo", "stream": True, "max_tokens": 3000,
            "messages": [{"role": "user", "content": "Write a very long story about routers."}]}
    async with (
        httpx.AsyncClient(base_url=mesh.http, timeout=60) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = response.aiter_lines()
        for _ in range(3):
            await anext(lines)
        busy = await heartbeat_counts(mesh.nats, 0.6, mesh.nats_token)
        assert sum(busy.values()) == 1, busy
    # Leaving the block closed the HTTP connection mid-stream.
    for _ in range(20):
        idle = await heartbeat_counts(mesh.nats, 0.5, mesh.nats_token)
        if idle and sum(idle.values()) == 0:
            break
    assert idle and sum(idle.values()) == 0, idle


def test_example_harness_runs_a_tool_loop(mesh: RunningMesh) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "agent_tool_loop.py"), "--target", mesh.grpc,
         "--prompt", "What is the weather in Paris?"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["tool_calls"] >= 1
    assert "22 degrees" in summary["final_text"]
