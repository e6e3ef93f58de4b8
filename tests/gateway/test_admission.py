"""Bounded admission (``gateway.admission``): slots, a priority queue, refusal with an estimated retry-after."""

from __future__ import annotations

import asyncio

import pytest

from gateway.admission import Admission
from services.common.errors import OverloadedError

pytestmark = pytest.mark.timeout(10)


async def hold(admission: Admission, release: asyncio.Event, order: list[str], name: str, priority: int = 0) -> None:
    async with admission.slot(priority):
        order.append(name)
        await release.wait()


async def test_no_limit_admits_everything() -> None:
    admission = Admission(0)
    async with admission.slot(), admission.slot():
        assert admission.active == 0


async def test_full_slots_queue_then_refuse_with_retry_after() -> None:
    admission = Admission(max_concurrent=2, max_queued=1, max_wait=5)
    release, order = asyncio.Event(), []
    running = [asyncio.create_task(hold(admission, release, order, f"r{i}")) for i in range(3)]
    await asyncio.sleep(0.05)
    assert order == ["r0", "r1"] and admission.active == 2 and admission.queued == 1
    with pytest.raises(OverloadedError) as info:
        async with admission.slot():
            pass
    assert info.value.http_status == 429 and info.value.retry_after >= 1 and admission.refused == 1
    release.set()
    await asyncio.gather(*running)
    assert order == ["r0", "r1", "r2"] and admission.active == 0 and admission.queued == 0


async def test_a_higher_priority_turn_gets_the_next_slot_first() -> None:
    admission = Admission(max_concurrent=1, max_queued=3, max_wait=5)
    release, order = asyncio.Event(), []
    first = asyncio.create_task(hold(admission, release, order, "first"))
    await asyncio.sleep(0.01)
    low = asyncio.create_task(hold(admission, release, order, "low", priority=0))
    await asyncio.sleep(0.01)
    high = asyncio.create_task(hold(admission, release, order, "high", priority=5))
    await asyncio.sleep(0.01)
    release.set()
    await asyncio.gather(first, low, high)
    assert order == ["first", "high", "low"]


async def test_a_wait_past_max_wait_is_refused_and_a_cancelled_waiter_frees_nothing_twice() -> None:
    admission = Admission(max_concurrent=1, max_queued=2, max_wait=0.1)
    release, order = asyncio.Event(), []
    first = asyncio.create_task(hold(admission, release, order, "first"))
    await asyncio.sleep(0.01)
    with pytest.raises(OverloadedError, match=r"within 0\.1 s"):
        async with admission.slot():
            pass
    waiter = asyncio.create_task(hold(admission, release, order, "gone"))
    await asyncio.sleep(0.01)
    waiter.cancel()
    release.set()
    await first
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert admission.active == 0 and order == ["first"]
    async with admission.slot():
        assert admission.active == 1


async def test_a_turn_whose_estimated_wait_exceeds_max_wait_is_refused_at_once() -> None:
    admission = Admission(max_concurrent=1, max_queued=10, max_wait=0.5)
    release, order = asyncio.Event(), []
    first = asyncio.create_task(hold(admission, release, order, "first"))
    await asyncio.sleep(0.01)
    admission.mean_hold = 1.0  # turns have held a slot ~1 s so far: a 0.5 s wait budget cannot be met
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(OverloadedError):
        async with admission.slot():
            pass
    assert loop.time() - started < 0.1  # refused without waiting
    release.set()
    await first


async def test_a_turn_that_would_wait_more_than_the_ttft_budget_is_refused_at_once() -> None:
    admission = Admission(max_concurrent=1, max_queued=5, max_wait=10, wait_ttfts=2)
    for _ in range(4):
        admission.ttft.add(0.05)  # typical TTFT 50 ms: a turn may wait 100 ms for a slot
    admission.mean_hold = 1.0
    release, order = asyncio.Event(), []
    first = asyncio.create_task(hold(admission, release, order, "first"))
    await asyncio.sleep(0.01)
    assert admission.wait_budget() == pytest.approx(0.1)
    with pytest.raises(OverloadedError, match=r"over the 0\.10 s a request may wait") as info:
        async with admission.slot():
            pass
    assert info.value.retry_after >= 0.9 and admission.refused == 1 and admission.queued == 0
    release.set()
    await first


async def test_a_slot_about_to_free_up_is_worth_waiting_for() -> None:
    admission = Admission(max_concurrent=1, max_queued=5, max_wait=10, wait_ttfts=2)
    for _ in range(4):
        admission.ttft.add(0.1)
    admission.mean_hold = 0.12  # the running turn should end ~0.1 s from now: within the 0.2 s budget
    release, order = asyncio.Event(), []
    first = asyncio.create_task(hold(admission, release, order, "first"))
    await asyncio.sleep(0.02)
    second = asyncio.create_task(hold(admission, release, order, "second"))
    await asyncio.sleep(0.01)
    assert admission.queued == 1
    release.set()
    await asyncio.gather(first, second)
    assert order == ["first", "second"] and admission.refused == 0


async def test_a_burst_that_filled_every_slot_frees_none_before_a_mean_hold_and_overdue_turns_run_another() -> None:
    admission = Admission(max_concurrent=2, max_queued=5, max_wait=10)
    admission.mean_hold = 0.5
    release, order = asyncio.Event(), []
    running = [asyncio.create_task(hold(admission, release, order, f"r{i}")) for i in range(2)]
    await asyncio.sleep(0.01)
    assert 0.4 < admission.estimated_wait(0) <= 0.5  # both started together: the first slot is a hold away
    assert 0.9 < admission.estimated_wait(2) <= 1.0  # two turns ahead on two slots: one more round
    admission.mean_hold = 0.005  # both are overdue now: of unknown length, expected to run another mean hold
    assert admission.estimated_wait(0) == pytest.approx(0.005)
    release.set()
    await asyncio.gather(*running)


async def test_refuse_now_with_unknown_priority_refuses_only_what_every_priority_would_be_refused() -> None:
    admission = Admission(max_concurrent=1, max_queued=5, max_wait=1.5)
    admission.mean_hold = 1.0
    release, order = asyncio.Event(), []
    first = asyncio.create_task(hold(admission, release, order, "first"))
    await asyncio.sleep(0.01)
    urgent = asyncio.create_task(hold(admission, release, order, "urgent", priority=5))
    await asyncio.sleep(0.01)
    assert admission.queued == 1
    assert admission.refuse_now(None) is None and admission.refuse_now(9) is None  # first in line: ~1 s away
    assert admission.refuse_now(0) is not None  # behind the urgent one: ~2 s away, over max_wait
    assert admission.refused == 1
    release.set()
    await asyncio.gather(first, urgent)


async def test_a_full_queue_refuses_at_once_whatever_the_priority() -> None:
    admission = Admission(max_concurrent=1, max_queued=0)
    async with admission.slot():
        refusal = admission.refuse_now()
        assert refusal is not None and "1 requests running, 0 waiting" in refusal.message
    assert admission.refuse_now() is None


async def test_the_ttft_of_a_turn_is_its_first_frame_after_the_grant_and_counted_once() -> None:
    admission = Admission(max_concurrent=2)
    for _ in range(3):
        async with admission.slot() as grant:
            await asyncio.sleep(0.01)
            grant.first_frame()
            grant.first_frame()
            assert grant.ttft is not None and grant.ttft >= 0.01
    assert admission.ttft.typical is None  # fewer than 4 turns: no typical TTFT, the budget is max_wait
    async with admission.slot() as grant:
        grant.first_frame()
    assert admission.ttft.typical is not None and admission.wait_budget() == admission.max_wait  # wait_ttfts 0
