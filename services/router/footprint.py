"""Session footprints: how much KV the sessions a router placed recently keep on each worker.

A worker's prefix cache is shared by every session whose turns it served. A session that comes back after
minutes (a human reading the answer, a long build) finds its prefix only if the worker did not need the room
in between, and the room it needs is the sum of the *live* sessions' contexts there, not the requests in
flight (an agent's KV sits idle between its turns). Placing a new session on whichever worker is least busy
at that moment stacks long-lived sessions unevenly; under KV pressure the crowded workers evict prefixes
their sessions come back for while others have room.

:class:`SessionFootprints` keeps, per session (``Identity.session_id``/``trajectory_id``: a sub-agent has its
own), the worker of its last turn and that turn's prompt blocks, for ``window`` seconds after the turn; a
worker's *live footprint* is the sum over the sessions placed there in that window. ``policy.py`` adds it to
the cost of every other session's placement, so a new session goes where live contexts leave the most room,
and a session already holding its prefix somewhere stays there (its own footprint is not counted against it,
and moving would cost its whole prefix as prefill). Memory: one entry per session seen in the window.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping

# kv-cache-tester slices of bench/agent_kv.py (seeds 0 and 1; idle gaps capped at 300 s), footprint weight 2,
# TTFT mean, window 300 / 600 s: 89.9 / 91.6 and 98.1 / 103.0 ms at 16,384 blocks per worker; 117.6 / 119.7 and
# 137.9 / 134.6 ms at 12,288 (KV pressure). Footprints off (seed 0): 98.0 and 131.0 ms.
DEFAULT_FOOTPRINT_WINDOW = 300.0


class SessionFootprints:
    """Per worker, the prompt blocks of the sessions whose last turn it served in the last ``window`` seconds."""

    def __init__(self, window: float = DEFAULT_FOOTPRINT_WINDOW, clock: Callable[[], float] = time.monotonic) -> None:
        if window <= 0:
            raise ValueError("footprint window must be > 0 (leave the footprints out to turn them off)")
        self.window = window
        self._clock = clock
        self._sessions: dict[str, tuple[str, int, float]] = {}   # session -> (worker, blocks, last seen)
        self._order: deque[tuple[float, str]] = deque()          # (seen at, session), oldest first; stale allowed
        self._live: dict[str, int] = {}                          # worker -> live blocks

    def record(self, session: str, worker_id: str, blocks: int) -> None:
        """``session``'s turn was placed on ``worker_id`` with a prompt of ``blocks`` blocks."""
        if not session:
            return
        now = self._clock()
        self._forget(session)
        self._sessions[session] = (worker_id, blocks, now)
        self._live[worker_id] = self._live.get(worker_id, 0) + blocks
        self._order.append((now, session))

    def live(self, session: str = "") -> Mapping[str, int]:
        """Live blocks per worker, ``session``'s own entry left out (workers with none are absent)."""
        self.expire()
        own = self._sessions.get(session) if session else None
        if own is None:
            return self._live
        live = dict(self._live)
        live[own[0]] -= own[1]
        return live

    def expire(self) -> None:
        """Forget the sessions whose last turn is older than the window."""
        horizon = self._clock() - self.window
        order, sessions = self._order, self._sessions
        while order and order[0][0] <= horizon:
            seen, session = order.popleft()
            entry = sessions.get(session)
            if entry is not None and entry[2] == seen:
                self._forget(session)

    def remove_worker(self, worker_id: str) -> None:
        """The worker left: its sessions' footprints go with it."""
        for session in [s for s, entry in self._sessions.items() if entry[0] == worker_id]:
            self._forget(session)
        self._live.pop(worker_id, None)

    def _forget(self, session: str) -> None:
        entry = self._sessions.pop(session, None)
        if entry is None:
            return
        worker_id, blocks, _ = entry
        left = self._live.get(worker_id, 0) - blocks
        if left > 0:
            self._live[worker_id] = left
        else:
            self._live.pop(worker_id, None)

    def __len__(self) -> int:
        return len(self._sessions)
