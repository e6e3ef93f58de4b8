"""How long the router waits for a worker's first frame before it gives the request to another worker.

A worker that accepted a request and then says nothing (its engine stuck while its process still answers
health and mux heartbeats) would hold the request until the stall timeout. The first frame is due after
the worker's queue and the request's prefill: :class:`FirstFrameDeadlines` estimates that from what the
same worker's recent first frames took for the prefill work they waited behind (blocks not cached,
theirs plus those ahead of them), doubled, plus one second of slack. A worker without history gets no
first-frame deadline (only the stall timeout): it is never judged on a guess; nor is the last worker a
request could go to. ``--first-frame-timeout`` replaces the estimate with a fixed number of seconds.
"""

from __future__ import annotations

from collections import deque

SLACK = 1.0    # seconds of silence allowed beyond the estimate
FACTOR = 2.0   # the estimate: twice what the slowest recent first frame took for as much work
HISTORY = 64   # first frames remembered per worker


class FirstFrameDeadlines:
    """Per worker: recent first-frame times and the prefill blocks they waited for; ``fixed`` > 0 overrides."""

    def __init__(self, fixed: float = 0.0) -> None:
        self.fixed = fixed
        self._workers: dict[str, deque[tuple[int, float]]] = {}  # worker -> (blocks, seconds), newest last

    def observe(self, worker_id: str, blocks: int, seconds: float) -> None:
        """A first frame came ``seconds`` after the attempt began, behind ``blocks`` prefill blocks."""
        self._workers.setdefault(worker_id, deque(maxlen=HISTORY)).append((max(blocks, 1), seconds))

    def timeout(self, worker_id: str, blocks: int) -> float | None:
        """Seconds to wait for the first frame of an attempt behind ``blocks`` prefill blocks; None: no limit."""
        if self.fixed > 0:
            return self.fixed
        history = self._workers.get(worker_id)
        if not history:
            return None
        slowest = max(seconds for _, seconds in history)
        per_block = max(seconds / count for count, seconds in history)
        return FACTOR * max(slowest, per_block * max(blocks, 1)) + SLACK
