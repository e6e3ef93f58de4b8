"""Bounded admission of chat turns at the edge: overload is refused before the first byte, not queued.

``max_concurrent`` turns run at once; up to ``max_queued`` more wait for a slot (the highest agent
priority first, then arrival order). A turn is refused at once with
:class:`~services.common.errors.OverloadedError` when the queue is full, or when its estimated wait is
over the **wait budget**: ``max_wait`` seconds, and with ``wait_ttfts`` also that many typical TTFTs (the
median time from a slot's grant to the turn's first frame over the last turns). A queued turn that
waits past ``max_wait`` anyway is refused then. So an admitted turn's first token comes within about
``1 + wait_ttfts`` typical TTFTs even under heavy overload: a queue place is only worth taking when a
slot is about to free up, and the rest are told at once to come back later.

The estimated wait of a turn with ``k`` turns queued ahead of it is when the ``k+1``-th slot frees up:
each running turn is expected to hold its slot for the mean hold time (a moving average) from its
grant, and one past that for another mean hold; so a burst that filled every slot at once is not
expected to free one for a whole hold time, nor are turns that run long.
``retry_after`` is that estimate for a turn arriving now (1 to 60 s).

:meth:`Admission.refuse_now` is the same decision for a request whose priority is not known yet (it is
read from the body): refused only if even the most urgent turn would be. The HTTP edge asks it before
reading, parsing or tracing a chat request (``gateway.app.AdmissionGate``), so a refusal costs next to
nothing. Each API answers an ``OverloadedError`` in its own shape: OpenAI 429, Anthropic 529
``overloaded_error``, gRPC ``RESOURCE_EXHAUSTED``, each with ``retry-after``. ``max_concurrent`` 0
admits everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import statistics
import time
from collections import deque
from collections.abc import AsyncIterator

from services.common.errors import OverloadedError

_MIN_RETRY, _MAX_RETRY = 1.0, 60.0
_TTFT_WINDOW = 64  # turns whose TTFT makes the typical one
_TTFT_MIN_SAMPLES = 4  # before these, only max_wait bounds a wait


class TtftWindow:
    """The TTFTs of the last turns (seconds from a slot's grant to the turn's first frame) and their median."""

    def __init__(self, size: int = _TTFT_WINDOW) -> None:
        self._samples: deque[float] = deque(maxlen=size)
        self.typical: float | None = None  # the median; None until a few turns were seen

    def add(self, seconds: float) -> None:
        self._samples.append(seconds)
        if len(self._samples) >= _TTFT_MIN_SAMPLES:
            self.typical = statistics.median(self._samples)


class Grant:
    """A turn's hold on a slot; :meth:`first_frame` marks its first frame (its TTFT feeds the wait budget)."""

    __slots__ = ("_ttft", "granted", "ttft")

    def __init__(self, ttft: TtftWindow) -> None:
        self._ttft = ttft
        self.granted = time.monotonic()
        self.ttft: float | None = None

    def first_frame(self) -> None:
        """Record the TTFT once; later calls do nothing."""
        if self.ttft is None:
            self.ttft = time.monotonic() - self.granted
            self._ttft.add(self.ttft)


class Admission:
    """Slots for chat turns (see module docstring)."""

    def __init__(self, max_concurrent: int = 0, max_queued: int = 0, max_wait: float = 10.0,
                 wait_ttfts: float = 0.0) -> None:
        self.max_concurrent = max_concurrent
        self.max_queued = max_queued
        self.max_wait = max_wait
        self.wait_ttfts = wait_ttfts
        self.refused = 0
        self.ttft = TtftWindow()
        self.mean_hold: float | None = None  # seconds a turn holds a slot (moving average; None: none yet)
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        # When each running turn got its slot.
        self._holding: dict[int, float] = {}
        self._handed_over = 0  # slots released to a waiter that has not woken up yet

    @property
    def active(self) -> int:
        """Turns holding a slot (a slot handed to a waiter counts from the hand-over)."""
        return len(self._holding) + self._handed_over

    @property
    def queued(self) -> int:
        return sum(1 for _, _, f in self._waiting if not f.done())

    @contextlib.asynccontextmanager
    async def slot(self, priority: int = 0) -> AsyncIterator[Grant]:
        """Hold a slot for the body of the ``async with``; raise :class:`OverloadedError` when refused."""
        if self.max_concurrent <= 0:
            yield Grant(self.ttft)
            return
        await self._acquire(priority)
        grant = Grant(self.ttft)
        key = next(self._seq)
        self._holding[key] = grant.granted
        try:
            yield grant
        finally:
            del self._holding[key]
            held = time.monotonic() - grant.granted
            self.mean_hold = held if self.mean_hold is None else self.mean_hold + 0.1 * (held - self.mean_hold)
            self._release()

    def refuse_now(self, priority: int | None = None) -> OverloadedError | None:
        """The refusal a turn of ``priority`` arriving now gets at once (counted in ``refused``), else None.

        ``priority`` None: not known yet; refused only if a turn of any priority would be.
        """
        if self.max_concurrent <= 0 or (self.active < self.max_concurrent and not self.queued):
            return None
        queued = self.queued
        if queued >= self.max_queued:
            reason = f"{self.active} requests running, {queued} waiting"
        else:
            wait, budget = self.estimated_wait(self._ahead(priority)), self.wait_budget()
            if wait <= budget:
                return None
            reason = f"a slot is {wait:.2f} s away, over the {budget:.2f} s a request may wait"
        self.refused += 1
        return OverloadedError(f"the server is overloaded ({reason}); retry later", retry_after=self.retry_after())

    async def _acquire(self, priority: int) -> None:
        """Return once the caller may hold a slot: it stamps its grant in the same step, before any await."""
        refusal = self.refuse_now(priority)
        if refusal is not None:
            raise refusal
        if self.active < self.max_concurrent:
            return
        turn = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (-priority, next(self._seq), turn))
        try:
            await asyncio.wait_for(asyncio.shield(turn), self.max_wait)
        except TimeoutError:
            if not turn.done() or turn.cancelled():
                turn.cancel()
                self.refused += 1
                raise OverloadedError(f"no slot freed up within {self.max_wait:g} s; retry later",
                                      retry_after=self.retry_after()) from None
            # handed a slot just as the wait ran out: take it
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._handed_over -= 1
                self._release()  # the slot was handed over as the client left
            turn.cancel()
            raise
        self._handed_over -= 1

    def _release(self) -> None:
        while self._waiting:
            _, _, turn = heapq.heappop(self._waiting)
            if not turn.done():
                self._handed_over += 1
                turn.set_result(None)  # the slot passes to the next waiter
                return

    def _ahead(self, priority: int | None) -> int:
        """Queued turns a new turn of ``priority`` would wait behind (None: the most urgent, so none)."""
        if priority is None:
            return 0
        return sum(1 for p, _, f in self._waiting if -p >= priority and not f.done())

    def estimated_wait(self, ahead: int) -> float:
        """Seconds until a slot frees up for a turn with ``ahead`` turns queued before it (0: no estimate yet)."""
        hold = self.mean_hold
        if hold is None or not self._holding:
            return 0.0
        rounds, index = divmod(ahead, len(self._holding))
        now = time.monotonic()
        # A turn is expected to end a mean hold after its grant; one already past that is of unknown length:
        # it is expected to run another mean hold (a long turn is no sign that it is about to end).
        remaining = (hold - now + granted if now - granted < hold else hold for granted in self._holding.values())
        nearest = min(remaining) if index == 0 else heapq.nsmallest(index + 1, remaining)[-1]
        return nearest + rounds * hold

    def wait_budget(self) -> float:
        """Seconds a turn may wait for a slot: ``max_wait``, and at most ``wait_ttfts`` typical TTFTs."""
        typical = self.ttft.typical
        if self.wait_ttfts <= 0 or typical is None:
            return self.max_wait
        return min(self.max_wait, self.wait_ttfts * typical)

    def retry_after(self) -> float:
        """Seconds until a slot is likely free for a request arriving now."""
        return min(max(self.estimated_wait(self.queued), _MIN_RETRY), _MAX_RETRY)
