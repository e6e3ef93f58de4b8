"""The tool-wait lease rule (services/common/tool_wait.py): per harness, bounded, the same for parse and replay."""

from __future__ import annotations

import math
import random

from services.common.tool_wait import ToolWaitEstimate, ToolWaitRule, ToolWaits


def brute_force(waits: list[float], rule: ToolWaitRule) -> float:
    """The rule computed from scratch on the last ``rule.window`` waits."""
    kept = sorted(waits[-rule.window:])
    if len(kept) < rule.min_samples:
        return rule.default_s
    hold = rule.margin * kept[min(len(kept) - 1, int(rule.quantile * len(kept)))]
    return min(max(hold, rule.floor_s), rule.ceiling_s)


def test_the_default_holds_until_enough_waits_were_seen_then_p90_times_one_and_a_half() -> None:
    est = ToolWaitEstimate(ToolWaitRule())
    for wait in range(1, 16):   # 15 waits: not enough
        est.add(float(wait) * 4)
        assert est.hold_s == 60.0 and not est.learnt
    est.add(64.0)               # 4, 8, ..., 64: p90 is the 15th of 16 (int(0.9 * 16) = 14 -> 60)
    assert est.learnt and est.hold_s == 1.5 * 60.0


def test_the_hold_is_clamped_to_ten_seconds_and_ten_minutes() -> None:
    short, long = ToolWaitEstimate(ToolWaitRule()), ToolWaitEstimate(ToolWaitRule())
    for _ in range(16):
        short.add(1.0)
        long.add(3600.0)
    assert (short.hold_s, long.hold_s) == (10.0, 600.0)


def test_the_window_forgets_old_waits_and_matches_the_rule_from_scratch() -> None:
    rng = random.Random(7)
    for rule in (ToolWaitRule(window=32, min_samples=4), ToolWaitRule(window=8, min_samples=8, quantile=0.5),
                 ToolWaitRule(floor_s=0.0, ceiling_s=math.inf, default_s=30.0)):
        est, waits = ToolWaitEstimate(rule), []
        for _ in range(300):
            wait = rng.choice([rng.uniform(0, 5), rng.uniform(0, 400), 2.0])  # with ties
            waits.append(wait)
            est.add(wait)
            assert est.hold_s == brute_force(waits, rule)
        assert len(est._ring) == len(est._ranked) == min(300, rule.window)


def test_waits_are_learnt_per_harness_from_a_tool_call_turns_end_to_the_sessions_next_turn() -> None:
    waits = ToolWaits(ToolWaitRule(min_samples=2, floor_s=0.0))
    assert waits.turn_arrived("s1", 0.0) is None             # no tool wait open: nothing recorded
    waits.tool_call_ended("s1", "claude-code", 10.0)
    waits.tool_call_ended("s2", "codex", 10.0)
    assert waits.turn_arrived("s1", 14.0) == 4.0
    assert waits.turn_arrived("s1", 15.0) is None            # the wait was closed by the turn before
    waits.tool_call_ended("s1", "claude-code", 20.0)
    assert waits.turn_arrived("s1", 26.0) == 6.0
    assert waits.turn_arrived("s2", 11.0) == 1.0
    assert waits.hold_s("claude-code") == 1.5 * 6.0          # [4, 6]: index int(0.9 * 2) = 1
    assert waits.hold_s("codex") == 60.0                     # one wait: still the default
    assert waits.hold_s("opencode") == 60.0                  # never seen
    assert waits.snapshot() == {"claude-code": (9.0, 2, True), "codex": (60.0, 1, False)}
    waits.tool_call_ended("", "claude-code", 30.0)           # anonymous: no session to wait for
    assert waits.turn_arrived("", 31.0) is None


def test_memory_is_bounded_in_sessions_and_harnesses() -> None:
    waits = ToolWaits(ToolWaitRule(sessions=3, harnesses=2))
    for k in range(5):
        waits.tool_call_ended(f"s{k}", "h", float(k))
    assert len(waits._waiting) == 3
    assert waits.turn_arrived("s0", 10.0) is None and waits.turn_arrived("s4", 10.0) == 6.0  # the oldest went
    for name in ("a", "b", "c"):
        waits.estimate(name)
    assert list(waits._harnesses) == ["b", "c"]


def test_the_replay_uses_the_same_rule_with_its_own_default_and_no_clamp() -> None:
    from services.replay.agent import REPLAY_RULE, AgentRetention
    from services.replay.trace import TraceRequest

    agents = AgentRetention()
    assert agents.waits.rule is REPLAY_RULE and agents.hold_s == 30.0
    now = 0.0
    for k in range(16):
        call = TraceRequest(timestamp_ms=0.0, input_length=1, output_length=1, hash_ids=(), session="t",
                            stop="tool_use")
        agents.finished(call, now)
        now += 1000.0 + k      # waits far beyond the live ceiling (600 s): not clamped here
        agents.arrived(call, now)
    assert agents.hold_s == 1.5 * (1000.0 + 14)  # p90 of 1000..1015: index int(0.9 * 16) = 14
