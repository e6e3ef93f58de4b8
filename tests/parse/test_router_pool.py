"""Spreading the parse service's router streams (``services/parse/router_pool.py``, ``router_replicas.py``):
round robin, a session's key kept on one router (prompt-reuse tails accepted), DNS names resolving to
several loopback addresses; real grpc.aio mux servers stand in for the routers."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from services.api import router_pb2, worker_pb2
from services.common import token_bytes
from services.common.prompt_reuse import ReusingStub, prompt_key
from services.launcher.supervisor import free_port
from services.parse.router_pool import RouterPool, RouterTarget, resolve_host
from tests.parse.fake_router import Router, serve

pytestmark = pytest.mark.timeout(30)


async def run(stub: ReusingStub, prompt: list[int], session: str = "") -> int:
    packed = token_bytes.pack(prompt)
    request = worker_pb2.GenerateRequest(token_ids_u32=packed)
    (name,) = [t async for frame in stub.Generate(request, key=prompt_key(session, packed)) for t in frame.token_ids]
    return name


def test_router_targets_parse() -> None:
    assert RouterTarget.parse("router-0.routers:50052") == RouterTarget("router-0.routers", 50052, False)
    assert RouterTarget.parse("dns:///routers.mesh.svc:50052") == RouterTarget("routers.mesh.svc", 50052, True)
    assert RouterTarget.parse("[::1]:7").address() == "[::1]:7"
    for bad in ("routers", "dns:///routers", "host:http", "host:0"):
        with pytest.raises(ValueError):
            RouterTarget.parse(bad)


async def test_a_real_dns_name_resolves() -> None:
    assert await resolve_host("localhost", 50052) in (["127.0.0.1:50052"], ["127.0.0.1:50052", "[::1]:50052"],
                                                      ["[::1]:50052", "127.0.0.1:50052"])


async def test_a_dns_name_of_two_addresses_spreads_streams_and_keeps_sessions_on_one_router() -> None:
    port = free_port()
    routers = {"127.0.0.1": Router(1), "127.0.0.2": Router(2)}  # the same port on two loopback addresses
    servers = [await serve(router, port, host) for host, router in routers.items()]
    lookups: list[str] = []

    async def resolve(host: str, p: int) -> list[str]:
        lookups.append(host)
        return [f"{ip}:{p}" for ip in routers]

    pool = RouterPool([f"dns:///routers.test:{port}"], resolve=resolve, refresh=0)
    await pool.start()
    stub = ReusingStub(pool.replicas, retry_unavailable=5.0)
    try:
        assert lookups == ["routers.test"] and len(pool.replicas.replicas) == 2
        short = Counter([await run(stub, [1, 2, 3]) for _ in range(20)])
        assert short == {1: 10, 2: 10}  # round robin

        # 24 sessions of 4 turns, each turn the previous prompt plus a little: after the first, tails. Which
        # router a key ranks first depends on the (random) port: with 24 keys all on one is a 2**-23 chance.
        sessions = {f"s{i}": list(range(i * 10_000, i * 10_000 + 3000)) for i in range(24)}
        placed: dict[str, set[int]] = {s: set() for s in sessions}
        for _turn in range(4):
            for session, prompt in sessions.items():
                prompt.extend(range(50))
                placed[session].add(await run(stub, prompt, session))
        assert all(len(names) == 1 for names in placed.values())  # every turn of a session on one router
        assert {n for names in placed.values() for n in names} == {1, 2}  # sessions on both routers
        assert sum(r.prompts.rebuilt for r in routers.values()) == len(sessions) * 3  # every later turn as a tail
        assert sum(r.prompts.refused for r in routers.values()) == 0

        listed = await pool.info.ListWorkers(router_pb2.ListWorkersRequest(), timeout=2)
        assert listed.workers[0].worker_id in ("w1", "w2")
    finally:
        await pool.close()
        for server in servers:
            await server.stop(0)


async def test_a_session_moves_when_its_router_goes_and_a_new_address_is_picked_up() -> None:
    port = free_port()
    first, second = Router(1), Router(2)
    servers = {"127.0.0.1": await serve(first, port, "127.0.0.1")}
    addresses = ["127.0.0.1"]

    async def resolve(host: str, p: int) -> list[str]:
        return [f"{ip}:{p}" for ip in addresses]

    pool = RouterPool([f"dns:///routers.test:{port}"], resolve=resolve, refresh=0.2, down_for=0.5)
    await pool.start()
    stub = ReusingStub(pool.replicas, retry_unavailable=5.0)
    try:
        prompts = {f"s{i}": list(range(i * 10_000, i * 10_000 + 3000)) for i in range(16)}
        assert {await run(stub, p, s) for s, p in prompts.items()} == {1}
        addresses.append("127.0.0.2")  # a second router joins under the name
        servers["127.0.0.2"] = await serve(second, port, "127.0.0.2")
        await asyncio.sleep(0.5)
        assert len(pool.replicas.replicas) == 2
        moved = {s for s, p in prompts.items() if await run(stub, [*p, 7], s) == 2}
        assert moved and len(moved) < len(prompts)  # only the keys the new router now ranks first move
        assert second.prompts.refused == len(moved)  # their tails were refused once and sent whole

        await servers.pop("127.0.0.1").stop(0)  # the first router goes: every session on the second
        addresses.remove("127.0.0.1")
        assert {await run(stub, [*p, 7, 8], s) for s, p in prompts.items()} == {2}
    finally:
        await pool.close()
        for server in servers.values():
            await server.stop(0)


async def test_no_address_yet_is_retried_until_the_name_resolves() -> None:
    port = free_port()
    server = await serve(Router(1), port)
    addresses: list[str] = []

    async def resolve(host: str, p: int) -> list[str]:
        if not addresses:
            raise OSError("NXDOMAIN")  # a headless Service before any router is ready
        return addresses

    pool = RouterPool([f"dns:///routers.test:{port}"], resolve=resolve, refresh=0)
    await pool.start()
    stub = ReusingStub(pool.replicas, retry_unavailable=5.0)
    try:
        assert pool.replicas.replicas == []
        asyncio.get_running_loop().call_later(0.3, addresses.append, f"127.0.0.1:{port}")
        assert await run(stub, [1, 2, 3]) == 1  # retried (UNAVAILABLE) and looked up again meanwhile
    finally:
        await pool.close()
        await server.stop(0)
