"""The mesh's NATS is authenticated and a heartbeat alone routes nothing: an anonymous client cannot
connect to the nats-server ``harnessmesh up`` starts, and a forged heartbeat (sent with the token, as a
compromised process could) announcing a fake worker gets no prompt: the router joins a worker only after
its gRPC ``Info`` at the announced address answers with the announced id."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import nats
import pytest

from services.api import kv_pb2, router_pb2, router_pb2_grpc, worker_pb2, worker_pb2_grpc
from services.common import subjects
from services.common.grpc_util import GrpcServer
from tests.support.mesh import running_mesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


class Impostor(worker_pb2_grpc.WorkerServicer):
    """A process that claims to be a worker: it would read every prompt sent to it."""

    def __init__(self) -> None:
        self.prompts = 0

    async def Generate(self, request: Any, context: Any) -> AsyncIterator[worker_pb2.GenerateResponse]:
        self.prompts += 1
        yield worker_pb2.GenerateResponse(token_ids=[1])

    async def Info(self, request: Any, context: Any) -> worker_pb2.WorkerInfo:
        return worker_pb2.WorkerInfo(worker_id="someone-else")


async def test_anonymous_nats_clients_are_refused_and_forged_workers_get_no_prompt(tmp_path: Path) -> None:
    args = ["--workers", "1", "--served-model-name", "demo", "--router-mode", "round-robin"]
    with running_mesh(args, tmp_path / "mesh.log") as mesh:
        with pytest.raises(Exception, match="Authorization Violation"):
            await nats.connect(mesh.nats, allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=0)
        impostor = Impostor()
        server = GrpcServer(None, "127.0.0.1", 0)
        worker_pb2_grpc.add_WorkerServicer_to_server(impostor, server.server)
        await server.start()
        nc = await nats.connect(mesh.nats, token=mesh.nats_token)
        try:
            beat = kv_pb2.WorkerHeartbeat(info=worker_pb2.WorkerInfo(
                worker_id="evil", grpc_address=server.address, block_size=16, total_blocks=1024))
            for _ in range(5):
                await nc.publish(subjects.heartbeat("default"), beat.SerializeToString())
                await asyncio.sleep(0.1)
            async with httpx.AsyncClient(timeout=30) as http:
                for i in range(6):
                    body = {"model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": f"p{i}"}]}
                    assert (await http.post(mesh.http + "/v1/chat/completions", json=body)).status_code == 200
            async with grpc.aio.insecure_channel(_router(mesh)) as ch:
                listed = await router_pb2_grpc.RouterStub(ch).ListWorkers(router_pb2.ListWorkersRequest())
            assert [w.worker_id for w in listed.workers] == ["worker-0"]
            assert impostor.prompts == 0
        finally:
            await nc.close()
            await server.stop(0)
    assert '"router.worker_unverified"' in (tmp_path / "mesh.log").read_text()


def _router(mesh: Any) -> str:
    """The router's address, from the launcher's log (``mesh.child_started`` of ``router``)."""
    for line in Path(mesh.log_path).read_text().splitlines():
        if '"mesh.child_started"' in line and '"name": "router"' in line:
            return str(json.loads(line)["address"])
    raise AssertionError("no router in the launcher log")
