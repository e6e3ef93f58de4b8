"""The parse service learns each harness's tool waits from consecutive turns of its sessions and sizes the
tool-call hold its generate requests carry by them (services/common/tool_wait.py, docs/agent-kv.md)."""

from __future__ import annotations

from typing import Any

from services.api import common_pb2
from services.common.tool_wait import ToolWaitRule
from services.parse.server import RunningParse
from tests.parse.test_service import FakeRouter, chat_request, collect, mesh, scripted

__all__ = ["mesh"]  # the fixture, shared with test_service.py


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def turn(session: str, harness: str, **identity: str) -> Any:
    request = chat_request()
    request.identity.CopyFrom(common_pb2.Identity(session_id=session, harness=harness,
                                                  **{"trajectory_id": session, **identity}))
    return request


async def test_the_tool_call_hold_is_learnt_per_harness_and_exported(
        mesh: tuple[FakeRouter, Any, RunningParse]) -> None:
    router, stub, parse = mesh
    waits = parse.servicer.tool_waits
    waits.rule = ToolWaitRule(min_samples=2, floor_s=0.0)  # before any harness was seen: two waits suffice here
    waits.clock = clock = Clock()
    for gap in (4.0, 6.0):  # each turn ends in a tool call (the scripted output); the next one comes `gap` later
        await collect(stub, turn("cc-1", "claude-code"))
        clock.now += gap
    await collect(stub, turn("cc-1", "claude-code"))
    await collect(stub, turn("cx-1", "codex"))
    holds = [r.retention.tool_call_hold_s for r in router.requests]
    assert holds == [60.0, 60.0, 1.5 * 6.0, 60.0]  # [4, 6] seen: p90 x 1.5; codex: none seen yet
    registry = parse.servicer.metrics.registry
    assert registry.get_sample_value("harnessmesh_parse_tool_wait_hold_seconds", {"harness": "claude-code"}) == 9.0
    assert registry.get_sample_value("harnessmesh_parse_tool_waits_total", {"harness": "claude-code"}) == 2.0


async def test_an_answer_opens_no_wait_and_a_sub_agents_turn_asks_to_go_first_if_it_answers(
        mesh: tuple[FakeRouter, Any, RunningParse]) -> None:
    router, stub, parse = mesh
    waits = parse.servicer.tool_waits
    waits.clock = clock = Clock()
    router.script = scripted("The weather is fine.")
    await collect(stub, turn("s", "claude-code"))
    clock.now += 5.0
    await collect(stub, turn("s", "claude-code"))
    assert waits.snapshot() == {}  # no tool call: nothing waited on
    await collect(stub, turn("s", "claude-code", trajectory_id="agent-1", parent_trajectory_id="s"))
    sub = router.requests[-1].retention
    assert sub.answer_evict_first and not sub.evict_first and not router.requests[0].retention.answer_evict_first
