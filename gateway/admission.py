"""Bounded admission of chat turns at the edge: overload is refused before the first byte, not queued.

``max_concurrent`` turns run at once; up to ``max_queued`` more wait for a slot (the highest agent
priority first, then arrival order) for at most ``max_wait`` seconds; anything beyond, and a turn whose
estimated wait already exceeds ``max_wait``, is refused at once with
:class:`~services.common.errors.OverloadedError`, whose ``retry_after`` estimates when a slot frees up
(the mean time a turn holds one, times the queue ahead over the slots). Each API answers it in
its own shape: OpenAI 429, Anthropic 529 ``overloaded_error``, gRPC ``RESOURCE_EXHAUSTED``, each with
``retry-after``. ``max_concurrent`` 0 admits everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import AsyncIterator

from services.common.errors import OverloadedError

_MIN_RETRY, _MAX_RETRY = 1.0, 60.0


class Admission:
    """Slots for chat turns (see module docstring)."""

    def __init__(self, max_concurrent: int = 0, max_queued: int = 0, max_wait: float = 10.0) -> None:
        self.max_concurrent = max_concurrent
        self.max_queued = max_queued
        self.max_wait = max_wait
        self.active = 0
        self.refused = 0
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self.mean_hold: float | None = None  # seconds a turn holds a slot (moving average; None: none yet)

    @property
    def queued(self) -> int:
        return sum(1 for _, _, f in self._waiting if not f.done())

    @contextlib.asynccontextmanager
    async def slot(self, priority: int = 0) -> AsyncIterator[None]:
        """Hold a slot for the body of the ``async with``; raise :class:`OverloadedError` when refused."""
        if self.max_concurrent <= 0:
            yield
            return
        await self._acquire(priority)
        started = time.monotonic()
        try:
            yield
        finally:
            held = time.monotonic() - started
            self.mean_hold = held if self.mean_hold is None else self.mean_hold + 0.1 * (held - self.mean_hold)
            self._release()

    async def _acquire(self, priority: int) -> None:
        if self.active < self.max_concurrent and not self.queued:
            self.active += 1
            return
        if self.queued >= self.max_queued or self._estimated_wait() > self.max_wait:
            self.refused += 1
            raise OverloadedError(f"the server is overloaded ({self.active} requests running, {self.queued} "
                                  "waiting); retry later", retry_after=self.retry_after())
        turn = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (-priority, next(self._seq), turn))
        try:
            await asyncio.wait_for(asyncio.shield(turn), self.max_wait)
        except TimeoutError:
            turn.cancel()
            self.refused += 1
            raise OverloadedError(f"no slot freed up within {self.max_wait:g} s; retry later",
                                  retry_after=self.retry_after()) from None
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._release()  # the slot was handed over as the client left
            turn.cancel()
            raise

    def _release(self) -> None:
        while self._waiting:
            _, _, turn = heapq.heappop(self._waiting)
            if not turn.done():
                turn.set_result(None)  # the slot passes to the next waiter
                return
        self.active -= 1

    def _estimated_wait(self) -> float:
        """Seconds a turn queued now would likely wait: the turns ahead of it times the mean hold, per slot."""
        return (self.mean_hold or 0.0) * (self.queued + 1) / max(self.max_concurrent, 1)

    def retry_after(self) -> float:
        """Seconds until a slot is likely free for a request arriving now."""
        return min(max(self._estimated_wait(), _MIN_RETRY), _MAX_RETRY)
