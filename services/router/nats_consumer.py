"""Feeds the router from NATS: workers' KV events and heartbeats, and starts index repairs.

One subscription covers the namespace, so a worker's KV events and its heartbeats are handled in the
order the worker published them: a heartbeat whose ``last_event_id`` is ahead of the index proves
events were lost even when no later event arrives to show the gap.
"""

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
from services.router.recovery import KvRecoverer
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
        recoverer: KvRecoverer,
        on_worker_gone: Callable[[WorkerEndpoint, bool], Awaitable[None]],
        expire_interval: float = 0.5,
        probe: Callable[[WorkerEndpoint], Awaitable[bool]] | None = None,
        verify: Callable[[WorkerEndpoint], Awaitable[bool]] | None = None,
    ) -> None:
        self._probe = probe  # a worker whose heartbeat is late stays while this says it is alive
        # A worker joins only once this confirms it over gRPC (it answers at the address it announced,
        # with the id it announced): a forged heartbeat on NATS gets no request.
        self._verify = verify
        self._verifying: dict[str, asyncio.Task[None]] = {}
        self._nc = nc
        self._ns = namespace
        self._router = router
        self._recoverer = recoverer
        self._on_gone = on_worker_gone
        self._expire_interval = expire_interval
        self._kv_prefix = subjects.kv_events(namespace, "")
        self._heartbeat = subjects.heartbeat(namespace)
        self._sub: Any = None
        self._expirer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(subjects.namespace_all(self._ns), cb=self._on_message)
        await self._nc.flush()
        await self._nc.publish(subjects.discover(self._ns), b"")
        self._expirer = asyncio.create_task(self._expire_loop())

    async def seed(self, records: list[bytes], timeout: float) -> int:
        """Take registry records (``services/common/worker_registry.py``) as the workers' heartbeats, each
        verified over gRPC like one; wait up to ``timeout`` s for the verifications. The workers joined."""
        waits = []
        claimed: list[str] = []
        for record in records:
            try:
                beat = kv_pb2.WorkerHeartbeat.FromString(record)
            except DecodeError:
                log.warning("router.bad_registry_record", size=len(record))
                continue
            await self._on_heartbeat(beat)
            claimed.append(beat.info.worker_id)
            task = self._verifying.get(beat.info.worker_id)
            if task is not None:
                waits.append(task)
        if waits:
            await asyncio.wait(waits, timeout=timeout)
        return sum(self._router.registry.get(wid) is not None for wid in claimed)

    async def stop(self) -> None:
        for task in list(self._verifying.values()):
            task.cancel()
        if self._expirer is not None:
            self._expirer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expirer
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
        await self._recoverer.close()

    async def _on_message(self, msg: Any) -> None:
        try:
            if msg.subject.startswith(self._kv_prefix):
                self._on_kv(kv_pb2.KvEventBatch.FromString(msg.data))
            elif msg.subject == self._heartbeat:
                await self._on_heartbeat(kv_pb2.WorkerHeartbeat.FromString(msg.data))
        except DecodeError:
            log.warning("router.bad_message", subject=msg.subject)

    def _on_kv(self, batch: kv_pb2.KvEventBatch) -> None:
        if self._router.on_kv_events(batch.worker_id, convert.kv_events(batch)):
            log.warning("router.kv_gap", worker_id=batch.worker_id,
                        last_event_id=self._router.index.last_event_id(batch.worker_id))
            self._recoverer.repair(batch.worker_id)

    async def _on_heartbeat(self, beat: kv_pb2.WorkerHeartbeat) -> None:
        endpoint = convert.endpoint(beat.info)
        wid = endpoint.worker_id
        if beat.leaving:
            gone = self._router.forget(wid)
            if gone is not None:
                log.info("router.worker_left", worker_id=gone.worker_id, address=gone.address)
                await self._on_gone(gone, False)
            return
        known = self._router.registry.get(wid)
        if self._verify is not None and known != endpoint:
            if wid not in self._verifying:
                self._verifying[wid] = asyncio.create_task(self._join_verified(beat, endpoint))
            return
        self._on_live_heartbeat(beat, endpoint)

    async def _join_verified(self, beat: kv_pb2.WorkerHeartbeat, endpoint: WorkerEndpoint) -> None:
        try:
            assert self._verify is not None
            if await self._verify(endpoint):
                self._on_live_heartbeat(beat, endpoint)
            else:
                log.warning("router.worker_unverified", worker_id=endpoint.worker_id, address=endpoint.address,
                            reason="its gRPC service does not answer with the announced id: not routed to")
        finally:
            self._verifying.pop(endpoint.worker_id, None)

    def _on_live_heartbeat(self, beat: kv_pb2.WorkerHeartbeat, endpoint: WorkerEndpoint) -> None:
        wid = endpoint.worker_id
        index = self._router.index
        if self._router.on_heartbeat(endpoint):
            log.info("router.worker_joined", worker_id=wid, address=endpoint.address,
                     block_size=endpoint.block_size, last_event_id=beat.last_event_id)
            if beat.last_event_id > (index.last_event_id(wid) or 0) or not index.is_synced(wid):
                self._recoverer.repair(wid, dump=True)
        elif index.is_behind(wid, beat.last_event_id):
            log.warning("router.kv_behind", worker_id=wid, published=beat.last_event_id,
                        applied=index.last_event_id(wid))
            self._recoverer.repair(wid)

    async def _expire_loop(self) -> None:
        kept: set[str] = set()  # workers alive without heartbeats (NATS down?): logged once
        while True:
            await asyncio.sleep(self._expire_interval)
            if self._probe is not None:
                # probed from half the timeout on: a probe that fails once (a loaded machine) is tried
                # again before the worker would expire
                late = self._router.overdue(0.5)
                alive = await asyncio.gather(*(self._probe(ep) for ep in late))
                for ep, ok in zip(late, alive, strict=True):
                    if not ok:
                        continue
                    self._router.registry.touch(ep.worker_id)
                    if ep.worker_id not in kept:
                        kept.add(ep.worker_id)
                        log.warning("router.worker_kept", worker_id=ep.worker_id, address=ep.address,
                                    reason="heartbeat overdue but the worker answers gRPC health (NATS down?)")
                kept.difference_update(ep.worker_id for ep, ok in zip(late, alive, strict=True) if not ok)
            for gone in self._router.expire():
                kept.discard(gone.worker_id)
                log.warning("router.worker_expired", worker_id=gone.worker_id, address=gone.address)
                await self._on_gone(gone, True)
