"""A session's next turn stays with its cache while another session's cold prompt prefills there (issue 35).

`harnessmesh up` with two mocker workers (speedup 1: a ~20k-token prompt takes the mocker seconds). Session A's
first turn lands on a worker; session C's cold prompt goes to the other one (the router's session footprints:
A's context lives on the first); session B's cold prompt then goes to A's worker (less live context there) and
prefills. A's next turn arrives while it does:

* shortest-first prefill (the default): the router counts only as much of B's prefill as A's few new blocks
  wait for, A's turn stays on its worker, finds its previous prompt cached and gets its first token long
  before B does;
* ``--prefill-order fcfs``: the router counts B's whole prefill as queue in front of A's turn and sends it to
  the other worker, where it recomputes its whole prompt.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from services.api import chat_pb2, chat_pb2_grpc, common_pb2
from tests.support.mesh import running_mesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


@dataclass(frozen=True)
class Turn:
    """Where one turn ran, what it found cached, and when its first token came (monotonic seconds)."""

    worker_id: str
    prompt_tokens: int
    cached_tokens: int
    first_token_at: float


def text(session: str, lines: int) -> str:
    return "\n".join(f"{session} line {i}: read module {i} of the {session} project and note what it exports."
                     for i in range(lines))


def turn_request(session: str, messages: list[tuple[str, str]]) -> chat_pb2.ChatRequest:
    return chat_pb2.ChatRequest(
        model="demo", identity=common_pb2.Identity(session_id=session, harness="test"),
        messages=[chat_pb2.Message(role=role, parts=[chat_pb2.Part(text=body)]) for role, body in messages],
        sampling=common_pb2.SamplingParams(max_tokens=2))


async def send(stub: chat_pb2_grpc.AgentServiceStub, request: chat_pb2.ChatRequest) -> Turn:
    started = None
    first_token_at = 0.0
    async for batch in stub.Chat(request):
        for event in batch.events:
            kind = event.WhichOneof("event")
            assert kind != "error", event.error.message
            if kind == "started":
                started = event.started
            elif not first_token_at and kind in ("text_delta", "reasoning_delta", "tool_call_start", "finish"):
                first_token_at = time.monotonic()
    assert started is not None
    return Turn(started.worker_id, started.prompt_tokens, started.cached_tokens, first_token_at)


async def scenario(target: str) -> tuple[Turn, Turn, Turn, Turn]:
    """(A's first turn, C's, A's next turn, B's)."""
    a1 = [("user", text("alpha", 60))]
    async with grpc.aio.insecure_channel(target) as channel:
        stub = chat_pb2_grpc.AgentServiceStub(channel)
        first = await send(stub, turn_request("alpha", a1))
        other = await send(stub, turn_request("gamma", [("user", text("gamma", 400))]))
        cold = asyncio.create_task(send(stub, turn_request("beta", [("user", text("beta", 500))])))
        await asyncio.sleep(0.3)  # B is prefilling
        a2 = [*a1, ("assistant", "Noted."), ("user", "Now list the tests.")]
        nxt = await send(stub, turn_request("alpha", a2))
        return first, other, nxt, await cold


@pytest.mark.parametrize("order", ["shortest", "fcfs"])
async def test_a_next_turn_is_not_pushed_off_its_cache_by_another_sessions_cold_prompt(
        tmp_path: Path, order: str) -> None:
    args = ["--workers", "2", "--served-model-name", "demo", "--block-size", "16", "--speedup", "1",
            "--heartbeat-interval", "0.2", "--prefill-order", order]
    with running_mesh(args, tmp_path / "mesh.log") as mesh:
        first, other, nxt, cold = await scenario(mesh.grpc)
    assert other.worker_id != first.worker_id, "the footprints sent C's session to the other worker"
    assert cold.worker_id == first.worker_id, "B's cold prompt went where less context lives"
    assert cold.prompt_tokens > 10 * (nxt.prompt_tokens - first.prompt_tokens)
    if order == "shortest":
        assert nxt.worker_id == first.worker_id
        assert nxt.cached_tokens >= 0.9 * first.prompt_tokens, (nxt, first)
        assert nxt.first_token_at < cold.first_token_at, "A's turn waited for B's whole prefill"
    else:
        assert nxt.worker_id != first.worker_id
        assert nxt.cached_tokens < 0.5 * first.prompt_tokens, (nxt, first)
