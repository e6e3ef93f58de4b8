"""Agent-aware retention in the replay: each trace request's hint from how its turn ended (issue 35).

Agent traces (``bench/agent_trace.py``) carry each request's ``session`` and ``stop``. A turn that ended in a
tool call (``tool_use``) is followed within seconds by its session's next turn, whose prompt repeats it: its
blocks are leased for the tool wait, a TTL learnt from the waits observed so far by the parse service's rule
(``services/common/tool_wait.py``: their p90 x 1.5; here 30 s until 16 were seen, and not clamped). A
sub-agent's turn that ended with an answer ends the sub-agent: its blocks go first. Any other turn (an answer
to a human) gets no hint: plain LRU.
"""

from __future__ import annotations

import math

from services.common.tool_wait import ToolWaitRule, ToolWaits
from services.kvcore.retention import RetentionHint
from services.replay.trace import TraceRequest

TOOL_CALL = "tool_use"
ANSWER = "end_turn"
# The live rule with the replay's own default and no clamp (a trace's waits are what they are).
REPLAY_RULE = ToolWaitRule(default_s=30.0, floor_s=0.0, ceiling_s=math.inf, sessions=1 << 20)
_HARNESS = ""  # agent traces are one harness's (kv-cache-tester: Claude Code)


class AgentRetention:
    """Hints for trace requests and the tool waits they show (see module docstring)."""

    def __init__(self, rule: ToolWaitRule | None = None) -> None:
        self.waits = ToolWaits(rule or REPLAY_RULE)
        self._estimate = self.waits.estimate(_HARNESS)

    @property
    def hold_s(self) -> float:
        """The lease a tool-call turn gets now."""
        return self._estimate.hold_s

    def hint(self, req: TraceRequest) -> RetentionHint | None:
        if req.stop == TOOL_CALL:
            return RetentionHint(hold_s=self._estimate.hold_s, strong=True)
        if req.stop == ANSWER and "/" in req.session:  # a sub-agent answered its parent: it is done
            return RetentionHint(first=True)
        return None

    def arrived(self, req: TraceRequest, now_s: float) -> None:
        """A request of ``req.session`` arrived: the session's tool wait, if it had one, is over."""
        self.waits.turn_arrived(req.session, now_s)

    def finished(self, req: TraceRequest, now_s: float) -> None:
        if req.stop == TOOL_CALL and req.session:
            self.waits.tool_call_ended(req.session, _HARNESS, now_s)
