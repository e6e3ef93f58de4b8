"""Overload is refused early, in each API's shape (issue 13): with 4 slots and 4 queue places, a full queue
means 429 / 529 / RESOURCE_EXHAUSTED with ``retry-after``; a burst of 40 turns gets at least the 4 slots
served and 429 at once for the rest that could not be served within the queue's wait budget; and the
official OpenAI and Anthropic SDKs, which retry on those, end up served."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import anthropic
import grpc
import httpx
import openai
import pytest

from services.api import chat_pb2, chat_pb2_grpc
from tests.support.mesh import RunningMesh, running_mesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ARGS = ["--workers", "1", "--speedup", "1", "--served-model-name", "demo", "--max-concurrent-requests", "4",
        "--max-queued-requests", "4", "--max-queue-wait", "5"]
BODY = {"model": "demo", "max_tokens": 24, "ignore_eos": True, "messages": [{"role": "user", "content": "hi"}]}


async def timed_post(http: httpx.AsyncClient, url: str, body: dict[str, object],
                     headers: dict[str, str] | None = None) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = await http.post(url, json=body, headers=headers)
    return response, time.monotonic() - started


async def test_a_burst_beyond_slots_and_queue_is_refused_early_in_each_api_shape(tmp_path: Path) -> None:
    with running_mesh(ARGS, tmp_path / "mesh.log") as mesh:
        async with httpx.AsyncClient(timeout=60) as http:
            # A fresh mesh has no TTFT or hold time to estimate a wait from: 4 turns run, 4 queue, the rest is refused.
            fill = [asyncio.create_task(timed_post(http, mesh.http + "/v1/chat/completions", BODY))
                    for _ in range(8)]
            await asyncio.sleep(0.3)
            anthropic_body = {"model": "demo", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
            overloaded, _ = await timed_post(http, mesh.http + "/v1/messages", anthropic_body,
                                             {"anthropic-version": "2023-06-01"})
            assert overloaded.status_code == 529, overloaded.text
            assert overloaded.json()["error"]["type"] == "overloaded_error" and "retry-after" in overloaded.headers
            await grpc_edge_is_resource_exhausted(mesh)
            assert all(r.status_code == 200 for r, _ in await asyncio.gather(*fill))  # the queued ones too

            # Now turns have a typical TTFT and hold time: a turn queues only when a slot is about to free up.
            burst = [timed_post(http, mesh.http + "/v1/chat/completions", BODY) for _ in range(40)]
            results = await asyncio.gather(*burst)
            served = [r for r, _ in results if r.status_code == 200]
            refused = [(r, t) for r, t in results if r.status_code == 429]
            assert len(served) + len(refused) == 40 and len(served) >= 4 and refused
            for response, seconds in refused:
                assert response.json()["error"]["type"] == "rate_limit_error"
                assert int(response.headers["retry-after"]) >= 1
                assert seconds < 1.0  # refused at once, not after queueing
            assert all(r.json()["usage"]["completion_tokens"] == 24 for r in served)
            metrics = (await http.get(mesh.http + "/metrics")).text
            assert f"harnessmesh_admission_refused_total {float(len(refused) + 2)}" in metrics
            assert 'harnessmesh_admission_turns{state="queued"}' in metrics


async def grpc_edge_is_resource_exhausted(mesh: RunningMesh) -> None:
    async with grpc.aio.insecure_channel(mesh.grpc) as channel:
        stub = chat_pb2_grpc.AgentServiceStub(channel)
        request = chat_pb2.ChatRequest(model="demo", messages=[chat_pb2.Message(
            role="user", parts=[chat_pb2.Part(text="hi")])])
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stub.Chat(request):
                pass
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert dict(info.value.trailing_metadata() or ())["retry-after"]


async def test_the_official_sdks_retry_refusals_and_end_up_served(tmp_path: Path) -> None:
    with running_mesh(ARGS, tmp_path / "mesh.log") as mesh:
        oai = openai.AsyncOpenAI(base_url=mesh.http + "/v1", api_key="none", max_retries=10)
        ant = anthropic.AsyncAnthropic(base_url=mesh.http, api_key="none", max_retries=10)

        async def openai_turn() -> int:
            reply = await oai.chat.completions.create(model="demo", max_tokens=24, messages=[
                {"role": "user", "content": "hi"}], extra_body={"ignore_eos": True})
            assert reply.usage is not None
            return reply.usage.completion_tokens

        async def anthropic_turn() -> int:
            reply = await ant.messages.create(model="demo", max_tokens=24, messages=[
                {"role": "user", "content": "hi"}])
            return reply.usage.output_tokens

        counts = await asyncio.gather(*(openai_turn() for _ in range(14)), *(anthropic_turn() for _ in range(6)))
        assert len(counts) == 20 and all(c > 0 for c in counts)
        await oai.close()
        await ant.close()
