"""How long a harness's tool waits last, learnt from the waits observed (agent-aware retention, docs/agent-kv.md).

A turn that ends in a tool call is followed, once the harness has run the tool, by the same session's next turn:
the *tool wait* is the time from the first turn's end to the next turn's arrival. The KV blocks of a turn that
ended in a tool call are leased for that wait; :class:`ToolWaits` sizes the lease per harness (Claude Code runs
``pytest``, Codex runs ``apply_patch``: their waits differ) by one rule, :class:`ToolWaitRule`: the waits'
``quantile`` times ``margin``, within ``[floor_s, ceiling_s]``, and ``default_s`` until ``min_samples`` waits
were seen. The parse service learns it from live traffic and the replay simulator from its trace: one
implementation, here.

Memory is bounded: each harness keeps its last ``window`` waits (a ring, and the same values sorted), at most
``harnesses`` harnesses are kept (the least recently seen goes), and at most ``sessions`` sessions may be
waiting at once (the oldest wait is dropped: that session's next turn is not counted).
"""

from __future__ import annotations

import time
from bisect import bisect_left, insort
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ToolWaitRule:
    """How a tool wait's lease is sized from the waits observed (see the module docstring)."""

    default_s: float = 60.0      # until ``min_samples`` waits were seen
    quantile: float = 0.9
    margin: float = 1.5
    min_samples: int = 16
    window: int = 512            # waits kept per harness
    floor_s: float = 10.0
    ceiling_s: float = 600.0
    harnesses: int = 64          # harnesses kept (each a window)
    sessions: int = 8192         # sessions waiting at once


class ToolWaitEstimate:
    """One harness's last ``rule.window`` tool waits and the lease they give (``hold_s``)."""

    def __init__(self, rule: ToolWaitRule) -> None:
        self.rule = rule
        self._ring: deque[float] = deque()
        self._ranked: list[float] = []
        self.seen = 0                    # waits observed in all
        self.hold_s = rule.default_s

    @property
    def learnt(self) -> bool:
        """Whether ``hold_s`` comes from observed waits (else it is the default)."""
        return len(self._ring) >= self.rule.min_samples

    def add(self, wait_s: float) -> None:
        rule, ring, ranked = self.rule, self._ring, self._ranked
        if len(ring) == rule.window:
            del ranked[bisect_left(ranked, ring.popleft())]
        ring.append(wait_s)
        insort(ranked, wait_s)
        self.seen += 1
        n = len(ranked)
        if n >= rule.min_samples:
            hold = rule.margin * ranked[min(n - 1, int(rule.quantile * n))]
            self.hold_s = min(max(hold, rule.floor_s), rule.ceiling_s)


class ToolWaits:
    """Tool waits per harness: a session's tool-call turn ended (:meth:`tool_call_ended`), its next turn
    arrived (:meth:`turn_arrived`: the wait is recorded), and the lease a harness's tool-call turn gets now
    (:meth:`hold_s`). Times in seconds; ``clock`` is the live caller's (the replay passes its simulated time)."""

    def __init__(self, rule: ToolWaitRule | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.rule = rule or ToolWaitRule()
        self.clock = clock
        self._waiting: OrderedDict[str, tuple[float, str]] = OrderedDict()  # session -> (ended, harness)
        self._harnesses: OrderedDict[str, ToolWaitEstimate] = OrderedDict()

    def estimate(self, harness: str) -> ToolWaitEstimate:
        """``harness``'s estimate (made on first use; the least recently used one goes past ``rule.harnesses``)."""
        harnesses = self._harnesses
        found = harnesses.get(harness)
        if found is None:
            found = harnesses[harness] = ToolWaitEstimate(self.rule)
            if len(harnesses) > self.rule.harnesses:
                harnesses.popitem(last=False)
        elif len(harnesses) > 1:
            harnesses.move_to_end(harness)
        return found

    def hold_s(self, harness: str) -> float:
        """The lease a tool-call turn of ``harness`` gets now."""
        found = self._harnesses.get(harness)
        return self.rule.default_s if found is None else found.hold_s

    def tool_call_ended(self, session: str, harness: str, now_s: float) -> None:
        """``session``'s turn ended in a tool call at ``now_s``: its next turn ends the wait."""
        if not session:
            return
        waiting = self._waiting
        waiting.pop(session, None)
        waiting[session] = (now_s, harness)
        if len(waiting) > self.rule.sessions:
            waiting.popitem(last=False)

    def turn_arrived(self, session: str, now_s: float) -> float | None:
        """A turn of ``session`` arrived at ``now_s``: the wait it ends (recorded for its harness), if any."""
        ended = self._waiting.pop(session, None)
        if ended is None:
            return None
        wait = max(0.0, now_s - ended[0])
        self.estimate(ended[1]).add(wait)
        return wait

    def snapshot(self) -> dict[str, tuple[float, int, bool]]:
        """Per harness: (hold_s, waits seen, learnt), for metrics."""
        return {h: (e.hold_s, e.seen, e.learnt) for h, e in self._harnesses.items()}

