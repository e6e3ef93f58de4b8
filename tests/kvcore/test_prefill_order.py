"""Prefill order (``--prefill-order``): shortest-first gives a step's budget to the prompts with the fewest tokens
left; fcfs keeps admission order. Driven by hand through the engine core (no asyncio)."""

from __future__ import annotations

import pytest

from services.common.model_dir import load_model_dir
from services.kvcore.config import BatchingConfig
from services.kvcore.core import EngineCore
from services.kvcore.domain import EngineRequest
from services.kvcore.outputs import CheckedRequest
from services.kvcore.request import CoreRequest
from services.kvcore.scheduler import Scheduler, StepPlan
from services.kvcore.tokens import FillerText, FillerVocabulary, TokenSource

TOKENIZER = load_model_dir("").tokenizer


def request(rid: str, prompt: list[int], max_tokens: int = 4) -> CoreRequest:
    checked = CheckedRequest(EngineRequest(rid, prompt, max_tokens=max_tokens), max_tokens, frozenset())
    source = TokenSource((), None, FillerText(FillerVocabulary(TOKENIZER), 7))
    return CoreRequest(checked, tokenizer=TOKENIZER, source=source)


def core(order: str, budget: int = 64) -> EngineCore:
    return EngineCore(BatchingConfig(block_size=4, num_blocks=256, max_num_batched_tokens=budget,
                                     prefill_order=order))


def shares(plan: StepPlan) -> dict[str, int]:
    """Prompt tokens each request computes in ``plan`` (decodes left out)."""
    return {item.request.request_id: item.prefill_tokens for item in plan.items if item.prefill_tokens}


def test_a_short_prompt_arriving_behind_a_long_one_is_computed_in_the_next_step() -> None:
    c = core("shortest")
    long = request("long", list(range(1000, 1400)))   # 400 tokens: 7 steps of 64
    c.add(long)
    first = c.plan_step()
    assert shares(first) == {"long": 64}
    c.complete_step(first)
    short = request("short", list(range(5000, 5020)))  # 20 tokens
    c.add(short)
    plan = c.plan_step()
    assert shares(plan) == {"short": 20, "long": 44}  # the short one first, the long one the rest
    done = c.complete_step(plan)
    assert done.first == [short]


def test_fcfs_keeps_the_short_prompt_waiting_until_the_long_one_is_done() -> None:
    c = core("fcfs")
    long = request("long", list(range(1000, 1400)))
    c.add(long)
    c.complete_step(c.plan_step())
    short = request("short", list(range(5000, 5020)))
    c.add(short)
    steps = 0
    while short.generated == 0:
        c.complete_step(c.plan_step())
        steps += 1
    assert steps == 6   # the long prompt's 336 tokens left take the whole budget first
    assert long.generated >= 1


def test_running_prefills_share_the_budget_shortest_first() -> None:
    c = core("shortest", budget=100)
    a, b = request("a", list(range(1000, 1300))), request("b", list(range(2000, 2090)))
    c.add(a)
    c.complete_step(c.plan_step())        # a: 100 of 300
    c.add(b)
    plan = c.plan_step()
    assert shares(plan) == {"a": 10, "b": 90}   # b (90 left) before a (200 left)
    c.complete_step(plan)
    plan = c.plan_step()
    assert shares(plan) == {"a": 100}
    c.complete_step(plan)


def test_the_waiting_head_counts_only_what_its_cached_prefix_leaves() -> None:
    c = core("shortest", budget=64)
    shared = list(range(3000, 3200))
    first = request("first", [*shared, 1])
    c.add(first)
    while first.generated == 0:
        c.complete_step(c.plan_step())
    while not first.finished:
        c.complete_step(c.plan_step())
    long = request("long", list(range(7000, 7400)))
    c.add(long)
    c.complete_step(c.plan_step())
    again = request("again", [*shared, 2, 3, 4])   # 203 tokens, 200 of them cached: 3 (plus the last block) left
    c.add(again)
    plan = c.plan_step()
    got = shares(plan)
    assert got["again"] < 16 and got["again"] + got["long"] == 64
    assert again.cached_tokens == 200 - 4 or again.cached_tokens == 200  # a block boundary at most


def test_one_prefill_at_a_time_plans_exactly_as_fcfs() -> None:
    plans = []
    for order in ("shortest", "fcfs"):
        c = core(order)
        steps = []
        for i in range(3):  # each arrives once the one before decodes: never two prefills at once
            req = request(f"r{i}", list(range(100 * i, 100 * i + 90 + 7 * i)), max_tokens=20)
            c.add(req)
            while req.generated == 0:
                plan = c.plan_step()
                steps.append((shares(plan), plan.decode_batch))
                c.complete_step(plan)
        while c.has_work:
            plan = c.plan_step()
            steps.append((shares(plan), plan.decode_batch))
            c.complete_step(plan)
        plans.append(steps)
    assert plans[0] == plans[1] and len(plans[0]) > 20


def test_an_unknown_order_is_refused() -> None:
    with pytest.raises(ValueError, match="prefill"):
        BatchingConfig(prefill_order="lifo")
    with pytest.raises(ValueError, match="prefill order"):
        Scheduler(EngineCore(BatchingConfig()).blocks, 4, 64, prefill_order="lifo")
