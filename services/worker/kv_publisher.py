"""Publishes a worker's KV events and heartbeats on NATS (subjects in ``services.common.subjects``).

* KV events: every batch drained from ``engine.kv_events()`` becomes one ``KvEventBatch`` on
  ``harnessmesh.NS.kv.WORKER_ID``, at most one per ``linger`` seconds: what the engine emits meanwhile is
  carried by the next (the first events after a quiet spell go as soon as the step that made them has
  handed its tokens to the stream writer: ``YIELDS_BEFORE_FIRST``). Decoding, an engine fills a block
  every few steps per stream; one message per step (~1,400 a second at 8 streams) cost the router more
  than the tokens did (1,024-token outputs at concurrency 8: ~21-31k tokens/s with none, ~36-54k with
  2 ms, noisy runs of ``bench/vs_dynamo.py``'s metric 5 workload), and 5 ms (the default since) against
  2 ms gave +12 % and +33 % tokens/s again (-11 % and -22 % CPU per request; two meshes side by side,
  positions swapped); the router counts a placement's prompt blocks as held from its own decision, so a
  few milliseconds of lag cost routing nothing (``services/router/pending.py``). Event ids are
  consecutive per worker (assigned by the engine).
  The last ``buffer_size`` published events are kept in :attr:`KvPublisher.recent` for replay, and the
  cached blocks they describe, with each one's parent, in :attr:`KvPublisher.blocks` for dumps (``kv_recovery.py``), so
  recovery works the same for every engine.
* Heartbeats (carrying the id of the last published event, so a router notices a lost final event): a
  ``WorkerHeartbeat`` on start, every ``interval`` seconds, at once in answer to any
  message on the discover subject, and a final one with ``leaving=True`` from :meth:`leave`.
* The registry record (``--registry-store jetstream``, given as a
  :class:`~services.common.worker_registry.RegistryWriter`): the same heartbeat, written to the registry
  bucket on start (awaited, at most ``REGISTRY_START_WAIT`` s, so a router started right after finds it)
  and with every periodic heartbeat (never holding the heartbeat up), deleted by :meth:`leave`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from itertools import repeat
from typing import Any

import structlog

from services.api import kv_pb2, worker_pb2
from services.common import subjects
from services.common.worker_registry import RegistryWriter
from services.worker import convert
from services.worker.engine import Engine, KvEvent, KvRemoved, KvStored

log = structlog.get_logger()

REGISTRY_START_WAIT = 2.0


# The loop turns a quiet spell's first events wait: the engine emits a prefill's blocks while it plans the
# step, so without them its publish (~0.2-0.4 ms for a 100k-token prompt's run) came before the step's first
# token left (engine output -> stream handler -> mux outbox -> session writer: three turns). Measured on a
# cached 100k-token turn, timestamps in the worker: the publish now follows the token's write.
YIELDS_BEFORE_FIRST = 3


class KvPublisher:
    """Bridges an engine's KV event feed and load to NATS (see module docstring)."""

    def __init__(
        self,
        nc: Any,  # nats.aio.client.Client
        engine: Engine,
        worker_info: Callable[[], worker_pb2.WorkerInfo],
        *,
        namespace: str,
        interval: float = 1.0,
        buffer_size: int = 4096,
        registry: RegistryWriter | None = None,
        linger: float = 0.0,
    ) -> None:
        self._nc = nc
        self._registry = registry
        self._engine = engine
        self._worker_info = worker_info
        self._worker_id = worker_info().worker_id
        self._namespace = namespace
        self._interval = interval
        self._linger = linger
        self._held: list[KvEvent] = []  # events taken from the engine, waiting out the linger
        self.recent: deque[kv_pb2.KvEvent] = deque(maxlen=buffer_size)
        self.blocks: dict[int, int | None] = {}  # cached block -> its parent (None: a first block)
        self.last_event_id = 0
        self.kv_subject = subjects.kv_events(namespace, self._worker_id)
        self._events = engine.kv_events()  # subscribe now so nothing emitted after this is lost
        self._tasks: list[asyncio.Task[None]] = []
        self._discover_sub: Any = None
        self._left = False

    async def start(self) -> None:
        self._discover_sub = await self._nc.subscribe(subjects.discover(self._namespace), cb=self._on_discover)
        await self.heartbeat()
        if self._registry is not None:
            try:
                await asyncio.wait_for(self._registry.put(self._record()), REGISTRY_START_WAIT)
            except Exception as exc:  # the heartbeats still announce the worker; later ones retry the write
                log.warning("worker.registry_unavailable", error=repr(exc),
                            reason="the worker is still announced by its heartbeats")
        self._tasks = [
            asyncio.create_task(self._publish_events(), name="kv-publisher-events"),
            asyncio.create_task(self._heartbeats(), name="kv-publisher-heartbeats"),
        ]

    async def heartbeat(self, leaving: bool = False) -> None:
        await self._nc.publish(subjects.heartbeat(self._namespace), self._record(leaving))

    def _record(self, leaving: bool = False) -> bytes:
        msg = convert.heartbeat_to_proto(self._worker_info(), self._engine.stats(), leaving)
        msg.last_event_id = self.last_event_id
        return msg.SerializeToString()

    async def publish(self, events: list[KvEvent]) -> None:
        """Publish one batch now (normally done by the background task)."""
        if not events:
            return
        batch = convert.events_to_proto(self._worker_id, events)
        self.recent.extend(batch.events)
        self._track(events)
        await self._nc.publish(self.kv_subject, batch.SerializeToString())

    def _track(self, events: list[KvEvent]) -> None:
        for event in events:
            if isinstance(event, KvStored):
                hashes = [b.block_hash for b in event.blocks]
                self.blocks.update(zip(hashes, [event.parent_hash, *hashes[:-1]], strict=True))
            elif isinstance(event, KvRemoved):
                deque(map(self.blocks.pop, event.block_hashes, repeat(None)), maxlen=0)
            else:
                self.blocks.clear()
            self.last_event_id = event.event_id

    def replay(self, from_event_id: int) -> list[kv_pb2.KvEvent] | None:
        """Published events from ``from_event_id`` on; None when the ring buffer no longer reaches back."""
        if from_event_id > self.last_event_id:
            return []
        if not self.recent or self.recent[0].event_id > from_event_id:
            return None
        return [e for e in self.recent if e.event_id >= from_event_id]

    async def leave(self) -> None:
        """Stop heartbeating and announce ``leaving=True`` (the router forgets this worker)."""
        self._left = True
        if self._discover_sub is not None:
            with contextlib.suppress(Exception):
                await self._discover_sub.unsubscribe()
            self._discover_sub = None
        if self._registry is not None:
            await self._registry.close()
        await self.heartbeat(leaving=True)
        with contextlib.suppress(Exception):
            await self._nc.flush(timeout=2)

    async def close(self) -> None:
        """Stop the tasks and publish any events still queued (call after the engine closed)."""
        if not self._left:
            await self.leave()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        held, self._held = self._held, []
        drain = getattr(self._events, "drain", None)
        await self.publish(held + (drain() if drain is not None else []))

    async def _publish_events(self) -> None:
        loop = asyncio.get_running_loop()
        drain = getattr(self._events, "drain", None)
        last = float("-inf")
        async for events in self._events:
            wait = last + self._linger - loop.time()
            self._held = events  # (stop() publishes them if the task is cancelled meanwhile)
            if wait > 0 and drain is not None:  # published less than ``linger`` ago: what comes meanwhile too
                await asyncio.sleep(wait)
            else:
                for _ in range(YIELDS_BEFORE_FIRST):
                    await asyncio.sleep(0)
            events, self._held = events + (drain() if drain is not None else []), []
            last = loop.time()
            try:
                await self.publish(events)
            except Exception:
                log.exception("worker.kv_publish_failed", events=len(events))

    async def _heartbeats(self) -> None:
        while not self._left:
            await asyncio.sleep(self._interval)
            if self._left:
                break
            try:
                record = self._record()
                await self._nc.publish(subjects.heartbeat(self._namespace), record)
                if self._registry is not None:
                    self._registry.offer(record)
            except Exception:
                log.exception("worker.heartbeat_failed")

    async def _on_discover(self, _msg: Any) -> None:
        if not self._left:
            await self.heartbeat()
