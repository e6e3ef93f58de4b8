"""Feeds the router from NATS: workers' KV events and heartbeats."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from google.protobuf.message import DecodeError

from services.api import kv_pb2
from services.common import subjects
from services.router import convert
from services.router.registry import WorkerEndpoint
from services.router.router import Router

log = structlog.get_logger()


class WorkerEventsConsumer:
    """Subscribes to KV events and heartbeats of one namespace and applies them to the router."""

    def __init__(
        self,
        nc: Any,
        namespace: str,
        router: Router,
        on_worker_gone: Callable[[WorkerEndpoint], Awaitable[None]],
        expire_interval: float = 0.5,
    ) -> None:
        self._nc = nc
        self._ns = namespace
        self._router = router
        self._on_gone = on_worker_gone
        self._expire_interval = expire_interval
        self._subs: list[Any] = []
        self._expirer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._subs.append(await self._nc.subscribe(subjects.kv_events_all(self._ns), cb=self._on_kv))
        self._subs.append(await self._nc.subscribe(subjects.heartbeat(self._ns), cb=self._on_heartbeat))
        await self._nc.flush()
        await self._nc.publish(subjects.discover(self._ns), b"")
        self._expirer = asyncio.create_task(self._expire_loop())

    async def stop(self) -> None:
        if self._expirer is not None:
            self._expirer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expirer
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs.clear()

    async def _on_kv(self, msg: Any) -> None:
        try:
            batch = kv_pb2.KvEventBatch.FromString(msg.data)
        except DecodeError:
            log.warning("router.bad_kv_message", subject=msg.subject)
            return
        self._router.on_kv_events(batch.worker_id, convert.kv_events(batch))

    async def _on_heartbeat(self, msg: Any) -> None:
        try:
            beat = kv_pb2.WorkerHeartbeat.FromString(msg.data)
        except DecodeError:
            log.warning("router.bad_heartbeat", subject=msg.subject)
            return
        endpoint = convert.endpoint(beat.info)
        if beat.leaving:
            gone = self._router.forget(endpoint.worker_id)
            if gone is not None:
                log.info("router.worker_left", worker_id=gone.worker_id, address=gone.address)
                await self._on_gone(gone)
            return
        if self._router.on_heartbeat(endpoint):
            log.info("router.worker_joined", worker_id=endpoint.worker_id, address=endpoint.address,
                     block_size=endpoint.block_size)

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(self._expire_interval)
            for gone in self._router.expire():
                log.warning("router.worker_expired", worker_id=gone.worker_id, address=gone.address)
                await self._on_gone(gone)
