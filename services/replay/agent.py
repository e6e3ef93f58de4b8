"""Agent-aware retention in the replay: each trace request's hint from how its turn ended (issue 35).

Agent traces (``bench/agent_trace.py``) carry each request's ``session`` and ``stop``. A turn that ended in a
tool call (``tool_use``) is followed within seconds by its session's next turn, whose prompt repeats it: its
blocks are leased for the tool wait, a TTL learnt from the waits observed so far (their ``quantile``, times
``margin``; ``default_hold_s`` until ``min_samples`` were seen). A sub-agent's turn that ended with an answer
ends the sub-agent: its blocks go first. Any other turn (an answer to a human) gets no hint: plain LRU.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass

from services.kvcore.retention import RetentionHint
from services.replay.trace import TraceRequest

TOOL_CALL = "tool_use"
ANSWER = "end_turn"


@dataclass(frozen=True)
class ToolWaitConfig:
    """How the lease of a tool wait is sized from the waits observed."""

    default_hold_s: float = 30.0
    quantile: float = 0.9
    margin: float = 1.5
    min_samples: int = 16
    window: int = 512


class AgentRetention:
    """Hints for trace requests and the tool waits they show (see module docstring)."""

    def __init__(self, config: ToolWaitConfig | None = None) -> None:
        self.config = config or ToolWaitConfig()
        self._waiting: dict[str, float] = {}      # session -> when its tool-call turn ended (s)
        self._waits: deque[float] = deque(maxlen=self.config.window)
        self._ranked: list[float] = []            # the same waits, sorted
        self._hold_s = self.config.default_hold_s

    @property
    def hold_s(self) -> float:
        """The lease a tool-call turn gets now."""
        return self._hold_s

    def hint(self, req: TraceRequest) -> RetentionHint | None:
        if req.stop == TOOL_CALL:
            return RetentionHint(hold_s=self._hold_s, strong=True)
        if req.stop == ANSWER and "/" in req.session:  # a sub-agent answered its parent: it is done
            return RetentionHint(first=True)
        return None

    def arrived(self, req: TraceRequest, now_s: float) -> None:
        """A request of ``req.session`` arrived: the session's tool wait, if it had one, is over."""
        ended = self._waiting.pop(req.session, None)
        if ended is None:
            return
        wait = max(0.0, now_s - ended)
        if len(self._waits) == self._waits.maxlen:  # the oldest leaves the window
            del self._ranked[bisect_left(self._ranked, self._waits[0])]
        self._waits.append(wait)
        insort(self._ranked, wait)
        c = self.config
        if len(self._waits) >= c.min_samples:
            ranked = self._ranked
            self._hold_s = c.margin * ranked[min(len(ranked) - 1, int(c.quantile * len(ranked)))]

    def finished(self, req: TraceRequest, now_s: float) -> None:
        if req.stop == TOOL_CALL and req.session:
            self._waiting[req.session] = now_s
