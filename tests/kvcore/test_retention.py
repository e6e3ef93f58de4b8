"""Agent-aware retention: leases keep a tool-waiting session's blocks ahead of finished turns, marked blocks go
first, every hold is soft (never refuses an allocation, never preempts), leases expire, KV events stay exact."""

from __future__ import annotations

import pytest

from services.common.model_dir import load_model_dir
from services.kvcore.block_manager import BlockManager, KvSequence
from services.kvcore.config import BatchingConfig
from services.kvcore.core import EngineCore
from services.kvcore.domain import EngineRequest, KvCleared, KvRemoved, KvStored
from services.kvcore.outputs import CheckedRequest
from services.kvcore.request import CoreRequest
from services.kvcore.retention import RetentionHint

BS = 4
TOKENIZER = load_model_dir("").tokenizer


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(bm: BlockManager, start: int, blocks: int, hold_s: float = 0.0, first: bool = False) -> list[int]:
    """A turn: ``blocks`` full blocks of its own computed, then freed (leased / marked as asked)."""
    tokens = list(range(start, start + blocks * BS))
    seq = KvSequence()
    cached = bm.acquire_prefix(seq, tokens)
    assert bm.append(seq, tokens[cached:])
    hashes = list(seq.hashes)
    bm.free(seq, hold_s, first)
    return hashes


def cached(bm: BlockManager, hashes: list[int]) -> int:
    return sum(h in bm.lru_order() for h in hashes)


def test_a_tool_waiting_sessions_blocks_outlast_later_finished_turns() -> None:
    for hold_s, kept in ((30.0, 8), (0.0, 0)):
        bm = BlockManager(24, BS, clock=Clock())
        waiting = run(bm, 0, 8, hold_s=hold_s)         # its turn ended in a tool call
        for k in range(1, 5):                           # finished turns overflow the cache
            run(bm, 10_000 * k, 8)
        assert cached(bm, waiting) == kept
        assert bm.retention.stats.leases == (1 if hold_s else 0)


def test_the_tool_result_turn_reuses_the_leased_prompt_and_counts_a_hit() -> None:
    bm = BlockManager(24, BS, clock=Clock())
    waiting = run(bm, 0, 8, hold_s=30.0)
    for k in range(1, 5):
        run(bm, 10_000 * k, 8)
    seq = KvSequence()
    tokens = [*range(8 * BS), 7, 7, 7, 7, 7]   # the prompt, the call and its result
    assert bm.acquire_prefix(seq, tokens) == 8 * BS
    assert seq.hashes == waiting
    assert (bm.retention.stats.hits, bm.retention.stats.hit_blocks) == (1, 8)
    assert bm.retention.held_blocks == 0


def test_a_lease_never_used_expires_and_its_blocks_are_reused() -> None:
    clock = Clock()
    bm = BlockManager(24, BS, clock=clock)
    waiting = run(bm, 0, 8, hold_s=30.0)
    run(bm, 10_000, 8)
    clock.now = 31.0
    run(bm, 20_000, 16)  # needs 8 of the inactive blocks: the expired lease's, least recently used
    assert cached(bm, waiting) == 0
    assert bm.retention.stats.expired_blocks == 8 and bm.retention.stats.broken_blocks == 0
    assert bm.retention.held_blocks == 0


def test_a_lease_is_soft_an_allocation_takes_leased_blocks_when_nothing_else_is_left() -> None:
    bm = BlockManager(16, BS, clock=Clock())
    waiting = run(bm, 0, 8, hold_s=30.0)
    run(bm, 10_000, 8, hold_s=30.0)
    run(bm, 20_000, 12)   # only leased blocks left to evict: it still fits
    assert cached(bm, waiting) == 0  # the older lease went first
    assert bm.retention.stats.broken_blocks == 12


def test_a_finished_sub_agents_blocks_go_before_older_ones() -> None:
    bm = BlockManager(24, BS, clock=Clock())
    older = run(bm, 0, 8)
    done = run(bm, 10_000, 8, first=True)   # a sub-agent answered its parent: it will not come back
    run(bm, 20_000, 16)
    assert cached(bm, done) == 0 and cached(bm, older) == 8
    assert bm.retention.stats.marked_blocks == 8


def test_events_stay_exact_under_retention() -> None:
    clock = Clock()
    bm = BlockManager(20, BS, clock=clock)
    held: set[int] = set()
    for k in range(12):
        run(bm, 10_000 * k, 3 + k % 4, hold_s=5.0 if k % 2 else 0.0, first=k % 5 == 4)
        clock.now += 2.0
        for event in bm.drain_events():
            if isinstance(event, KvStored):
                held.update(b.block_hash for b in event.blocks)
            elif isinstance(event, KvRemoved):
                held.difference_update(event.block_hashes)
            elif isinstance(event, KvCleared):
                held.clear()
        assert held == set(bm.lru_order())  # nothing active: the index equals the cache


def request(rid: str, start: int, n: int, max_tokens: int) -> CoreRequest:
    checked = CheckedRequest(EngineRequest(rid, list(range(start, start + n)), max_tokens=max_tokens, ignore_eos=True),
                             max_tokens, frozenset())
    return CoreRequest(checked, tokenizer=TOKENIZER)


def drive(core: EngineCore, req: CoreRequest) -> None:
    core.add(req)
    for _ in range(200):
        plan = core.plan_step()
        if not plan.items:
            break
        core.complete_step(plan, [5] * len(plan.items))
        if req.request_id not in core.requests:
            return
    raise AssertionError("request did not finish")


@pytest.mark.parametrize("retention", [True, False])
def test_a_lease_never_refuses_or_preempts_a_running_request(retention: bool) -> None:
    clock = Clock()
    core = EngineCore(BatchingConfig(block_size=BS, num_blocks=16, retention=retention), clock=clock)
    tool_turn = request("tool", 0, 40, 2)
    tool_turn.retention = RetentionHint(hold_s=600.0)
    drive(core, tool_turn)
    assert core.blocks.retention.held_blocks == (10 if retention else 0)
    big = request("big", 50_000, 56, 6)     # needs 15 of the 16 blocks: the leased ones among them
    drive(core, big)
    assert big.generated == 6 and core.scheduler.preemptions == 0
    assert core.blocks.retention.stats.broken_blocks == (10 if retention else 0)


def test_the_off_switch_ignores_hints() -> None:
    core = EngineCore(BatchingConfig(block_size=BS, num_blocks=32, retention=False), clock=Clock())
    req = request("a", 0, 20, 2)
    req.retention = RetentionHint(hold_s=60.0)
    drive(core, req)
    assert core.blocks.retention.held_blocks == 0 and core.blocks.retention.stats.leases == 0


def test_a_plain_lease_goes_before_a_tool_waits_when_only_leased_blocks_are_left() -> None:
    bm = BlockManager(16, BS, clock=Clock())
    tool_wait = run(bm, 0, 8)
    bm.retention.retain(tool_wait, 30.0, first=False, strong=True)  # as free(..., strong=True) leases them
    cached_5m = run(bm, 10_000, 8, hold_s=300.0)                    # cache_control: a plain lease, newer
    run(bm, 20_000, 8)
    assert cached(bm, tool_wait) == 8 and cached(bm, cached_5m) == 0


def test_the_lease_a_hint_asks_for_depends_on_how_the_turn_ended() -> None:
    hint = RetentionHint(hold_s=300.0, tool_call_hold_s=60.0, tool_call_ids=frozenset({4098}))
    assert hint.lease_for([11, 4098, 12]) == (300.0, True)   # a tool call: strong
    assert hint.lease_for([11, 12]) == (300.0, False)        # an answer: only what cache_control asked
    assert RetentionHint(tool_call_hold_s=60.0, tool_call_ids=frozenset({4098})).lease_for([5]) == (0.0, False)
    assert RetentionHint(hold_s=20.0, strong=True).lease_for([]) == (20.0, True)


def test_a_sub_agents_answer_marks_its_blocks_but_its_tool_call_leases_them() -> None:
    hint = RetentionHint(tool_call_hold_s=60.0, tool_call_ids=frozenset({4098}), answer_first=True)
    assert hint.first_for([11, 12]) and not hint.first_for([11, 4098])
    assert hint.lease_for([11, 4098]) == (60.0, True)
    assert not RetentionHint(answer_first=True).first_for([11])  # no marker known: an answer cannot be told
    assert RetentionHint(first=True).first_for([4098])


def test_marking_first_spares_blocks_a_running_request_still_holds() -> None:
    bm = BlockManager(24, BS, clock=Clock())
    tokens = list(range(8 * BS))
    running, done = KvSequence(), KvSequence()
    assert bm.acquire_prefix(running, tokens[: 4 * BS]) == 0 and bm.append(running, tokens[: 4 * BS])
    assert bm.acquire_prefix(done, tokens) == 4 * BS and bm.append(done, tokens[4 * BS:])
    shared, own = done.hashes[:4], done.hashes[4:]
    bm.free(done, first=True)                 # a sub-agent that shares the running request's head answered
    assert list(bm.retention.first) == own and shared == running.hashes
