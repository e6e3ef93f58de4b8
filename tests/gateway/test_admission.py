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
