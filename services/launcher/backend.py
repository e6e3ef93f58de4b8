"""The router and its N workers: the part of a mesh both ``harnessmesh up`` and ``replay --live`` start.

:func:`start_backend` spawns the router, then the workers, on free loopback ports through a
:class:`Supervisor`, waits until each is healthy and until the router has discovered every worker
(their first heartbeats reached it over NATS), and returns the children. Only the options differ
between the two users; the order, the wiring and the waits are here once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from services.api import router_pb2, router_pb2_grpc
from services.common.grpc_util import open_channel
from services.launcher.specs import ROUTER, WORKER, build_settings
from services.launcher.supervisor import POLL, Child, Supervisor, free_port, past


@dataclass(frozen=True)
class Backend:
    """The started router and workers."""

    router: Child
    workers: list[Child]


async def start_backend(
    supervisor: Supervisor,
    *,
    workers: int,
    nats_url: str,
    nats_token: str = "",
    deadline: float,
    values: Mapping[str, Any] | None = None,
    router_options: Mapping[str, Any] | None = None,
    worker_options: Callable[[str], Mapping[str, Any]] = lambda name: {},
) -> Backend:
    """Start the router and ``workers`` workers named ``worker-<i>``, healthy and known to the router.

    Each child's settings are ``values`` (options given by the user, e.g. ``harnessmesh up``'s) under
    ``router_options`` / ``worker_options(name)`` under the wiring chosen here (addresses, ports, ids).
    """
    values = dict(values or {})
    wiring = {"nats_url": nats_url, "nats_token": nats_token, "host": "127.0.0.1"}
    port = free_port()
    router_settings = build_settings(ROUTER.settings_class(), values, {**(router_options or {}), **wiring,
                                                                       "port": port})
    router = await supervisor.spawn("router", ROUTER, router_settings, f"127.0.0.1:{port}")
    children = []
    for i in range(workers):
        name, port = f"worker-{i}", free_port()
        settings = build_settings(WORKER.settings_class(), values, {
            **worker_options(name), **wiring, "port": port, "advertise_host": "127.0.0.1", "worker_id": name})
        children.append(await supervisor.spawn(name, WORKER, settings, f"127.0.0.1:{port}"))
    await supervisor.wait_healthy([router, *children], deadline)
    await wait_router_sees(supervisor, router, workers, deadline)
    return Backend(router, children)


async def wait_router_sees(supervisor: Supervisor, router: Child, count: int, deadline: float) -> None:
    """Wait until the router's ``ListWorkers`` lists at least ``count`` workers."""
    channel = open_channel(router.grpc_address, None, supervisor.tls)
    stub = router_pb2_grpc.RouterStub(channel)
    try:
        while True:
            supervisor.check_alive()
            with contextlib.suppress(Exception):
                reply = await stub.ListWorkers(router_pb2.ListWorkersRequest(), timeout=1.0)
                if len(reply.workers) >= count:
                    return
            if past(deadline):
                raise TimeoutError(f"router did not discover {count} workers")
            await asyncio.sleep(POLL)
    finally:
        await channel.close(None)
