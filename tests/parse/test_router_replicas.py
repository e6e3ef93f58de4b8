"""Router replicas behind the parse service's Generate stub (``services/parse/router_replicas.py``): real
grpc.aio mux servers on loopback standing in for two routers."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from services.api import router_pb2, router_pb2_grpc, worker_pb2
from services.common import mux, token_bytes
from services.common.grpc_util import open_channel, open_mux_channel
from services.common.prompt_reuse import ReusingStub
from services.launcher.supervisor import free_port
from services.parse.router_replicas import RouterInfo, RouterReplicas
from tests.parse.fake_router import Router, serve

pytestmark = pytest.mark.timeout(30)


async def tokens(stub: ReusingStub) -> list[int]:
    request = worker_pb2.GenerateRequest(token_ids_u32=token_bytes.pack([1, 2, 3]))
    return [t async for frame in stub.Generate(request) for t in frame.token_ids]


async def test_streams_fail_over_to_the_next_replica_and_spread_again_when_it_is_back() -> None:
    ports = [free_port(), free_port()]
    first, second = Router(1), Router(2)
    servers = [await serve(second, ports[1])]  # the first replica is down
    channels = [open_mux_channel(f"127.0.0.1:{port}") for port in ports]
    replicas = RouterReplicas([mux.GenerateStub(c, "Router") for c in channels], down_for=0.3)
    stub = ReusingStub(replicas, retry_unavailable=5.0)
    try:
        assert [await tokens(stub) for _ in range(4)] == [[2]] * 4  # retried on the second, then straight there
        assert replicas.failovers >= 2 and second.served == 4
        servers.append(await serve(first, ports[0]))
        deadline = asyncio.get_running_loop().time() + 10
        while await tokens(stub) != [1]:  # streams go to it again once it is back (and gRPC has reconnected)
            assert asyncio.get_running_loop().time() < deadline, "the first replica never got streams back"
            await asyncio.sleep(0.1)
        served = [await tokens(stub) for _ in range(10)]
        assert served.count([1]) == served.count([2]) == 5  # round robin
    finally:
        for channel in channels:
            await channel.close()
        for server in servers:
            await server.stop(0)


async def test_readiness_asks_the_replicas_in_order() -> None:
    port, down = free_port(), free_port()
    server = await serve(Router(2), port)
    channels = [open_channel(f"127.0.0.1:{down}", None), open_channel(f"127.0.0.1:{port}", None)]
    info = RouterInfo([router_pb2_grpc.RouterStub(c) for c in channels])
    try:
        listed = await info.ListWorkers(router_pb2.ListWorkersRequest(), timeout=2)
        assert [w.worker_id for w in listed.workers] == ["w2"]
        alone = RouterInfo([router_pb2_grpc.RouterStub(channels[0])])
        with pytest.raises(grpc.aio.AioRpcError):
            await alone.ListWorkers(router_pb2.ListWorkersRequest(), timeout=2)
    finally:
        for channel in channels:
            await channel.close()
        await server.stop(0)
