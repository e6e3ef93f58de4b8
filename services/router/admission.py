"""The priority queue in front of placement: used only while every worker is saturated.

Requests wait ordered by priority (higher first), then arrival. A request is let through when some
worker has room; it must call :meth:`AdmissionQueue.settled` once its load is counted (so the next
waiter sees it), and :meth:`AdmissionQueue.pump` runs whenever load drops.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable


class AdmissionQueue:
    """Priority-then-FIFO queue of requests waiting for an unsaturated worker."""

    def __init__(self, saturated: Callable[[], bool]) -> None:
        self._saturated = saturated
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._granting = False

    def __len__(self) -> int:
        return sum(1 for *_, fut in self._heap if not fut.done())

    async def admit(self, priority: int) -> bool:
        """Return once the request may be placed; True if it waited (then call :meth:`settled`)."""
        if not self._heap and not self._granting and not self._saturated():
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (-priority, next(self._seq), fut))
        self.pump()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # granted, then the caller went away
                self.settled()
            raise
        return True

    def settled(self) -> None:
        """The request let through last has its load counted: consider the next one."""
        self._granting = False
        self.pump()

    def pump(self) -> None:
        """Let the best waiting request through if a worker has room."""
        while self._heap and not self._granting and not self._saturated():
            _, _, fut = heapq.heappop(self._heap)
            if fut.done():
                continue
            fut.set_result(None)
            self._granting = True
