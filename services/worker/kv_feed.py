"""Fan-out of KV events from an engine to any number of subscribers (usually one: the publisher)."""

from __future__ import annotations

import asyncio

from services.worker.engine import KvEvent


class KvEventSubscription:
    """An async iterator over batches of KV events: each item is everything emitted since the last read."""

    def __init__(self, feed: KvEventFeed) -> None:
        self._feed = feed
        self._pending: list[KvEvent] = []
        self._ready = asyncio.Event()
        self._closed = False

    def _push(self, event: KvEvent) -> None:
        self._pending.append(event)
        self._ready.set()

    def drain(self) -> list[KvEvent]:
        """Everything pending now, without waiting."""
        out, self._pending = self._pending, []
        self._ready.clear()
        return out

    def close(self) -> None:
        """Unsubscribe; a pending ``__anext__`` ends the iteration once the queue is empty."""
        self._closed = True
        self._feed._subscribers.discard(self)
        self._ready.set()

    def __aiter__(self) -> KvEventSubscription:
        return self

    async def __anext__(self) -> list[KvEvent]:
        while not self._pending:
            if self._closed:
                raise StopAsyncIteration
            await self._ready.wait()
            self._ready.clear()
        return self.drain()


class KvEventFeed:
    """Synchronous ``emit`` (called from the engine loop) into per-subscriber queues."""

    def __init__(self) -> None:
        self._subscribers: set[KvEventSubscription] = set()

    def emit(self, event: KvEvent) -> None:
        for sub in self._subscribers:
            sub._push(event)

    def subscribe(self) -> KvEventSubscription:
        sub = KvEventSubscription(self)
        self._subscribers.add(sub)
        return sub

    def close(self) -> None:
        for sub in list(self._subscribers):
            sub.close()
