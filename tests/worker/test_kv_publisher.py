"""The KV publisher's linger: a burst of engine steps' events goes out in one NATS message, the first events
after a quiet spell once the step's token has left, nothing lost or reordered, events still lingering published
at stop."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.api import kv_pb2, worker_pb2
from services.worker.engine import EngineStats, KvRemoved
from services.worker.kv_feed import KvEventFeed
from services.worker.kv_publisher import KvPublisher

pytestmark = pytest.mark.timeout(10)


class FakeNats:
    """Records KV event batches (the publisher's only collaborator on the wire)."""

    def __init__(self) -> None:
        self.batches: list[tuple[float, list[int]]] = []
        self.sent = asyncio.Event()

    async def publish(self, subject: str, data: bytes) -> None:
        if ".kv." in subject:
            batch = kv_pb2.KvEventBatch.FromString(data)
            self.batches.append((asyncio.get_running_loop().time(), [e.event_id for e in batch.events]))
            self.sent.set()

    async def subscribe(self, subject: str, cb: Any = None) -> Any:
        return None

    async def flush(self, timeout: float = 0) -> None:
        return None


class FakeEngine:
    def __init__(self) -> None:
        self.feed = KvEventFeed()

    def kv_events(self) -> Any:
        return self.feed.subscribe()

    def stats(self) -> EngineStats:
        return EngineStats(0, 0, 0, 0, 0, 1, 16)


def publisher(linger: float) -> tuple[KvPublisher, FakeNats, FakeEngine]:
    nc, engine = FakeNats(), FakeEngine()
    info = worker_pb2.WorkerInfo(worker_id="w", block_size=16, total_blocks=1)
    return KvPublisher(nc, engine, lambda: info, namespace="t", linger=linger), nc, engine  # type: ignore[arg-type]


async def test_a_burst_goes_in_one_message_and_the_first_events_at_once() -> None:
    pub, nc, engine = publisher(0.2)
    await pub.start()
    started = asyncio.get_running_loop().time()
    engine.feed.emit(KvRemoved(1, (1,)))
    await asyncio.sleep(0.02)
    assert [ids for _, ids in nc.batches] == [[1]]  # not held back: nothing was published before
    for event_id in range(2, 6):  # four steps' events within the linger
        engine.feed.emit(KvRemoved(event_id, (event_id,)))
        await asyncio.sleep(0.01)
    while len(nc.batches) < 2:
        nc.sent.clear()
        await asyncio.wait_for(nc.sent.wait(), 2)
    assert [ids for _, ids in nc.batches] == [[1], [2, 3, 4, 5]]
    assert nc.batches[1][0] - started >= 0.19
    await pub.close()


async def test_events_lingering_at_stop_are_published() -> None:
    pub, nc, engine = publisher(5.0)
    await pub.start()
    engine.feed.emit(KvRemoved(1, (1,)))
    await asyncio.sleep(0.02)
    engine.feed.emit(KvRemoved(2, (2,)))
    await asyncio.sleep(0.02)  # taken by the publisher, lingering
    engine.feed.emit(KvRemoved(3, (3,)))
    await pub.close()
    assert [ids for _, ids in nc.batches] == [[1], [2, 3]]
    assert pub.last_event_id == 3


async def test_without_linger_every_read_is_a_message() -> None:
    pub, nc, engine = publisher(0.0)
    await pub.start()
    for event_id in range(1, 4):
        engine.feed.emit(KvRemoved(event_id, (event_id,)))
        await asyncio.sleep(0.01)
    await pub.close()
    assert [ids for _, ids in nc.batches] == [[1], [2], [3]]


async def test_a_quiet_spells_first_events_wait_for_the_steps_token_to_leave() -> None:
    """The engine emits a prefill's blocks while it plans the step; the publish waits the loop turns a token
    takes from the engine to the stream writer (here: a chain of that many hand-offs started in the same turn),
    so the step's first token is not held up by it. The events it waited for go in the same message."""
    from services.worker.kv_publisher import YIELDS_BEFORE_FIRST

    pub, nc, engine = publisher(0.2)
    await pub.start()
    await asyncio.sleep(0)  # the publisher waits for events
    written: list[int] = []

    async def token_to_writer(turns: int) -> None:  # engine output -> handler -> outbox -> session writer
        for _ in range(turns):
            await asyncio.sleep(0)
        written.append(len(nc.batches))  # messages published when the token's write began

    engine.feed.emit(KvRemoved(1, (1,)))
    token = asyncio.ensure_future(token_to_writer(YIELDS_BEFORE_FIRST - 1))
    engine.feed.emit(KvRemoved(2, (2,)))  # the same step's later events
    await asyncio.wait_for(nc.sent.wait(), 2)
    await token
    assert written == [0]
    assert [ids for _, ids in nc.batches] == [[1, 2]]
    await pub.close()
