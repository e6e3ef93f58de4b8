"""Sibling sub-agents launched together land on one worker (issue 15).

Four requests sharing ~93 % of a ~10k-token prompt are sent within 10 ms to a mesh of four idle mocker
workers. The first one's KV events cannot reach the router before the others are placed; the router's
pending-prefix index (``services/router/pending.py``) counts the first one's prompt blocks as held by its
worker from the moment it is placed, so all four go there and share one prefill of the prefix. With the
index off (``--pending-prefix-ttl 0``) the same requests spread over the idle workers: each prefills the
prefix again. A fifth sibling sent after the first finished finds the prefix cached on that worker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.api import chat_pb2, chat_pb2_grpc, common_pb2
from tests.support.mesh import RunningMesh, running_mesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

SIBLINGS = 4
# ~46 tokens a rule, ~32 a step: ~9,300 shared tokens (system prompt), ~700 of each sibling's own (its task).
SHARED_RULES = 201
OWN_RULES = 22


@dataclass(frozen=True)
class Placed:
    """Where one sibling went and what it found cached there, and when it was sent."""

    worker_id: str
    cached_tokens: int
    prompt_tokens: int
    sent_at: float


def sibling_request(k: int) -> chat_pb2.ChatRequest:
    system = "You are a sub-agent of a coding agent. Project rules:\n" + "\n".join(
        f"Rule {i}: keep the file tree tidy, run the tests before you finish, and report what changed."
        for i in range(SHARED_RULES))
    task = f"Sub-agent {k}: your task.\n" + "\n".join(
        f"Step {k}.{i}: inspect module {k * 1000 + i} and list the functions it exports." for i in range(OWN_RULES))
    return chat_pb2.ChatRequest(
        model="demo",
        messages=[
            chat_pb2.Message(role="system", parts=[chat_pb2.Part(text=system)]),
            chat_pb2.Message(role="user", parts=[chat_pb2.Part(text=task)]),
        ],
        sampling=common_pb2.SamplingParams(max_tokens=4),
    )


async def _send(stub: chat_pb2_grpc.AgentServiceStub, k: int) -> Placed:
    sent_at = time.monotonic()
    started = None
    async for batch in stub.Chat(sibling_request(k)):
        for event in batch.events:
            kind = event.WhichOneof("event")
            assert kind != "error", event.error.message
            if kind == "started":
                started = event.started
    assert started is not None
    return Placed(started.worker_id, started.cached_tokens, started.prompt_tokens, sent_at)


async def send_siblings(target: str) -> tuple[list[Placed], Placed]:
    """Four siblings at once, then a fifth after they finished: (the four, the fifth)."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = chat_pb2_grpc.AgentServiceStub(channel)
        together = await asyncio.gather(*(_send(stub, k) for k in range(SIBLINGS)))
        fifth = await _send(stub, SIBLINGS)
    return list(together), fifth


def mesh_args() -> list[str]:
    # Speedup 1: a ~10k-token prefill takes the mocker ~1.3 s, far longer than the siblings take to arrive.
    return ["--workers", str(SIBLINGS), "--served-model-name", "demo", "--block-size", "16",
            "--heartbeat-interval", "0.2", "--speedup", "1"]


@pytest.fixture(scope="module")
def four_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningMesh]:
    tmp = tmp_path_factory.mktemp("siblings")
    with running_mesh(mesh_args(), Path(tmp) / "mesh.log") as running:
        yield running


async def test_siblings_sent_together_share_one_worker_and_its_prefill(four_workers: RunningMesh) -> None:
    assert len(four_workers.workers) == SIBLINGS
    together, fifth = await send_siblings(four_workers.grpc)
    sent = [p.sent_at for p in together]
    assert max(sent) - min(sent) < 0.010, "the siblings were not sent within 10 ms"
    assert all(9_500 < p.prompt_tokens < 11_000 for p in together), [p.prompt_tokens for p in together]
    workers = {p.worker_id for p in together}
    assert len(workers) == 1, f"siblings spread over {sorted(workers)}"
    # The later siblings reused the blocks the first one computed (it was still prefilling).
    shared_tokens = 0.9 * min(p.prompt_tokens for p in together)
    assert sum(p.cached_tokens >= shared_tokens for p in together) == SIBLINGS - 1, \
        [p.cached_tokens for p in together]
    assert fifth.worker_id in workers
    assert fifth.cached_tokens >= shared_tokens, fifth
    # The router says why: the three later siblings were placed on predicted blocks.
    assert await kv_predicted_decisions(four_workers.metrics["router"]) == SIBLINGS - 1


async def kv_predicted_decisions(url: str) -> float:
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.get(url)
    assert response.status_code == 200
    return sum(sample.value for family in text_string_to_metric_families(response.text)
               for sample in family.samples
               if sample.name == "harnessmesh_router_decisions_total" and sample.labels.get("reason") == "kv_predicted")
