"""One API key guards every edge, and no secret is on any process's argv: ``harnessmesh up`` given the key
only as an environment variable; HTTP and the gRPC edge both refuse a call without it."""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import pytest

from services.api import chat_pb2, chat_pb2_grpc
from tests.support.mesh import running_mesh
from tests.support.procs import child_pids

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

KEY = "sk-test-5f2c9a1e7b"


def argv_of(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


async def test_every_edge_needs_the_key_and_no_argv_carries_it(tmp_path: Path) -> None:
    env = {"HARNESSMESH_GATEWAY_API_KEY": KEY}
    with running_mesh(["--workers", "1", "--served-model-name", "demo"], tmp_path / "mesh.log", env=env) as mesh:
        pids = [mesh.process.pid, *(pid for module in ("gateway", "services.parse", "services.router",
                                                       "services.worker")
                                    for pid in child_pids(mesh.process.pid, module))]
        assert len(pids) == 5
        assert all(KEY.encode() not in argv_of(pid) for pid in pids)
        body = {"model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        async with httpx.AsyncClient(timeout=30) as http:
            assert (await http.post(mesh.http + "/v1/chat/completions", json=body)).status_code == 401
            keyed = await http.post(mesh.http + "/v1/chat/completions", json=body,
                                    headers={"authorization": f"Bearer {KEY}"})
            assert keyed.status_code == 200
        request = chat_pb2.ChatRequest(model="demo", messages=[chat_pb2.Message(
            role="user", parts=[chat_pb2.Part(text="hi")])])
        async with grpc.aio.insecure_channel(mesh.grpc) as channel:
            stub = chat_pb2_grpc.AgentServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in stub.Chat(request):
                    pass
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetModel(chat_pb2.ModelInfoRequest(), metadata=(("x-api-key", "wrong"),))
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            batches = [b async for b in stub.Chat(request, metadata=(("x-api-key", KEY),))]
            assert any(e.HasField("finish") for b in batches for e in b.events)
