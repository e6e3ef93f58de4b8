"""The worker registry in a JetStream KV bucket, beside the heartbeats (``--registry-store jetstream``).

Each worker keeps its latest ``WorkerHeartbeat`` (id, address, block size, capacity, engine, last event
id) under its id in the bucket ``harnessmesh_<namespace>_workers``: written when it starts and again
with every heartbeat, deleted when it leaves. A record lives ``ttl`` seconds after it was written (the
bucket's age limit: 3 heartbeat intervals), so a worker that died without leaving drops out by itself.
A starting router reads every record before it serves (:func:`read_records`), so it knows the fleet at
once instead of after the workers' next heartbeats. A record is a claim, not a proof: the router
still confirms each worker over gRPC before routing to it, as it does for a heartbeat.

Records are a few hundred bytes: they go in the bucket as they are (no :class:`~services.common.jetstream.ChunkedKv`
index), in the servers' memory (a record is rewritten within a heartbeat interval; nothing is lost
when NATS restarts that the workers do not write again).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog
from nats.js.errors import NotFoundError

from services.common.jetstream import BucketConfig, bucket_name, kv_key, open_bucket
from services.common.settings import option

log = structlog.get_logger()

STORES = ("heartbeats", "jetstream")  # --registry-store: heartbeats only, or heartbeats + the bucket


def store_option() -> Any:
    """``--registry-store``, declared once for the worker and the router (a shared option)."""
    return option(
        "jetstream", "Where routers learn the fleet: the workers' NATS heartbeats only, or also a JetStream KV bucket "
        "each worker writes its record to (TTL 3 heartbeat intervals), which a starting router reads before it "
        "routes; NATS without JetStream: heartbeats only, with a warning (docs/state.md).", shared=True,
        choices=STORES)


def bucket_option() -> Any:
    """``--registry-bucket``, declared once for the worker and the router (a shared option)."""
    return option("", "jetstream registry: the KV bucket (empty: harnessmesh_<namespace>_workers).", shared=True)
KIND = "workers"
TTL_HEARTBEATS = 3  # a record lives this many heartbeat intervals after it was written


def registry_bucket(configured: str, namespace: str) -> str:
    """The registry bucket's name: ``configured``, else ``harnessmesh_<namespace>_workers``."""
    return bucket_name(configured, namespace, KIND)


class RegistryWriter:
    """One worker's record in the registry bucket (see module docstring).

    :meth:`offer` never waits for NATS (it is called from the heartbeat loop, which must not be held up):
    the latest offered record is written by one task, and a record offered while a write is in flight
    replaces the one waiting. The bucket is opened on the first write and again after a failure (JetStream
    may come up after the worker: a NATS cluster electing its leader).
    """

    def __init__(self, js: Any, config: BucketConfig, worker_id: str) -> None:
        self._js = js
        self._config = config
        self._key = kv_key(worker_id)
        self._kv: Any = None
        self._pending: bytes | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._failing = False
        self.writes = 0

    async def put(self, record: bytes) -> None:
        """Write ``record`` now (raises when NATS or JetStream refuses)."""
        if self._kv is None:
            self._kv = await open_bucket(self._js, self._config)
        try:
            await self._kv.put(self._key, record)
        except Exception:
            self._kv = None  # open (or create) the bucket again next time: it may have been deleted
            raise
        self.writes += 1
        if self._failing:
            self._failing = False
            log.info("worker.registry_restored", bucket=self._config.name)

    def offer(self, record: bytes) -> None:
        """Have ``record`` written soon; returns at once."""
        if self._closed:
            return
        self._pending = record
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="worker-registry-write")

    async def close(self, *, delete: bool = True, timeout: float = 2.0) -> None:
        """Stop writing (a write in flight finishes first, so none lands after) and delete the record."""
        self._closed = True
        self._pending = None
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
            self._task.cancel()
        if delete and self._kv is not None:
            try:
                await asyncio.wait_for(self._kv.delete(self._key), timeout)
            except Exception as exc:  # it expires with the bucket's TTL anyway
                log.warning("worker.registry_delete_failed", bucket=self._config.name, error=repr(exc))

    async def _drain(self) -> None:
        while self._pending is not None and not self._closed:
            record, self._pending = self._pending, None
            try:
                await self.put(record)
            except Exception as exc:
                if not self._failing:  # once per streak of failures, not once per heartbeat
                    self._failing = True
                    log.warning("worker.registry_unavailable", bucket=self._config.name, error=repr(exc),
                                reason="the worker is still announced by its heartbeats")


async def read_records(js: Any, bucket: str, timeout: float = 2.0) -> list[bytes]:
    """Every record in ``bucket`` (those the age limit has not dropped); [] when the bucket does not exist yet."""
    try:
        kv = await js.key_value(bucket)
    except NotFoundError:  # BucketNotFoundError included
        return []
    watcher = await kv.watchall(ignore_deletes=True)
    records: list[bytes] = []
    try:
        async with asyncio.timeout(timeout):
            while (entry := await watcher.updates(timeout=timeout)) is not None:  # None: the end of what is stored
                if entry.value:
                    records.append(entry.value)
    finally:
        with contextlib.suppress(Exception):
            await watcher.stop()
    return records
