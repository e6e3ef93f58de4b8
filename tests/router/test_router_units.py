"""Domain pieces of the router without network: admission, recovery, policy options, stream stitching."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

from services.api import common_pb2, worker_pb2
from services.common import token_bytes
from services.common.block_hash import sequence_hashes
from services.router import convert
from services.router.admission import AdmissionQueue
from services.router.index import KvEvent, KvIndex, StoredEvent
from services.router.policy import PlacementPolicy
from services.router.recovery import Dump, KvRecoverer
from services.router.registry import WorkerEndpoint, WorkerLoad, WorkerRegistry
from services.router.stream import StreamProgress


async def test_admission_orders_by_priority_then_arrival() -> None:
    busy = [True]
    queue = AdmissionQueue(lambda: busy[0])
    order: list[str] = []

    async def waiter(name: str, prio: int) -> None:
        if await queue.admit(prio):
            order.append(name)
            queue.settled()

    tasks = []
    for name, prio in [("low1", 0), ("low2", 0), ("high", 5), ("mid", 1)]:
        tasks.append(asyncio.create_task(waiter(name, prio)))
        await asyncio.sleep(0)
    assert len(queue) == 4
    busy[0] = False
    queue.pump()
    await asyncio.gather(*tasks)
    assert order == ["high", "mid", "low1", "low2"]


async def test_admission_cancelled_waiter_is_skipped() -> None:
    busy = [True]
    queue = AdmissionQueue(lambda: busy[0])
    t = asyncio.create_task(queue.admit(3))
    await asyncio.sleep(0)
    t.cancel()
    await asyncio.sleep(0)
    busy[0] = False
    assert await asyncio.wait_for(queue.admit(0), 1)  # the cancelled one does not block the queue
    queue.settled()
    assert len(queue) == 0


class FakeSource:
    def __init__(self, log: list[KvEvent], blocks: set[int], buffer_from: int = 1) -> None:
        self.log, self.blocks, self.buffer_from = log, blocks, buffer_from

    async def replay(self, endpoint: WorkerEndpoint, from_event_id: int) -> Sequence[KvEvent] | None:
        if from_event_id < self.buffer_from:
            return None
        return [e for e in self.log if e.event_id >= from_event_id]

    async def dump(self, endpoint: WorkerEndpoint) -> Dump:
        return Dump(self.log[-1].event_id, sorted(self.blocks))


def setup(buffer_from: int) -> tuple[KvIndex, KvRecoverer, list[KvEvent], FakeSource]:
    index, registry = KvIndex(), WorkerRegistry(5.0)
    registry.heartbeat(WorkerEndpoint("w", "x:1", 16, 100))
    log: list[KvEvent] = [StoredEvent(i, (i * 10,)) for i in range(1, 6)]
    source = FakeSource(log, {e.block_hashes[0] for e in log if isinstance(e, StoredEvent)}, buffer_from)
    return index, KvRecoverer(index, registry, source), log, source


async def test_gap_is_repaired_by_replay_and_held_back_events_follow() -> None:
    index, recoverer, log, _ = setup(buffer_from=1)
    assert index.apply("w", log[:2]) is False
    assert index.apply("w", [log[3]]) is True  # event 3 lost
    recoverer.repair("w")
    index.apply("w", [log[4]])  # arrives while the repair runs: held back
    await recoverer.wait_idle()
    assert index.last_event_id("w") == 5 and index.blocks("w") == {10, 20, 30, 40, 50}
    assert recoverer.replays == 1 and recoverer.dumps == 0


async def test_gap_older_than_the_buffer_falls_back_to_a_dump() -> None:
    index, recoverer, log, _ = setup(buffer_from=4)
    index.apply("w", log[:1])
    assert index.apply("w", [log[4]]) is True
    recoverer.repair("w")
    await recoverer.wait_idle()
    assert index.last_event_id("w") == 5 and index.blocks("w") == {10, 20, 30, 40, 50}
    assert recoverer.dumps == 1


def test_first_seen_mid_stream_needs_repair_but_from_event_one_does_not() -> None:
    index = KvIndex()
    assert index.apply("a", [StoredEvent(1, (1,))]) is False
    assert index.apply("b", [StoredEvent(7, (1,))]) is True
    assert index.is_behind("a", 3) and not index.is_behind("a", 1)


def test_osl_adds_expected_decode_blocks_and_temperature_spreads() -> None:
    loads = {"a": WorkerLoad(), "b": WorkerLoad(requests=1, active_blocks=30)}
    policy = PlacementPolicy("kv", 1.0)
    plain = policy.rank(10, {"a": 0, "b": 10}, loads)
    with_osl = policy.rank(10, {"a": 0, "b": 10}, loads, decode_blocks=8)
    assert with_osl[0].cost == plain[0].cost + 8
    hot = PlacementPolicy("kv", 1.0, random.Random(1), temperature=5.0)
    firsts = {hot.rank(10, {"a": 0, "b": 10}, loads)[0].worker_id for _ in range(50)}
    assert firsts == {"a", "b"}
    cold = PlacementPolicy("kv", 1.0, random.Random(1), temperature=0.0)
    assert {cold.rank(10, {"a": 0, "b": 10}, loads)[0].worker_id for _ in range(20)} == {"a"}


def test_prefer_puts_the_target_worker_first() -> None:
    from services.router.router import Router

    registry = WorkerRegistry(5.0)
    for wid in ("a", "b"):
        registry.heartbeat(WorkerEndpoint(wid, wid, 16, 100))
    router = Router(KvIndex(), registry, PlacementPolicy("kv", 1.0))
    prompt = list(range(64))
    router.on_kv_events("a", [StoredEvent(1, tuple(sequence_hashes(prompt, 16)))])
    assert router.place(prompt).candidates[0].worker_id == "a"
    assert router.place(prompt, prefer="b").candidates[0].worker_id == "b"


def frame(tokens: list[int], **kw: object) -> worker_pb2.GenerateResponse:
    return worker_pb2.GenerateResponse(token_ids=tokens, **kw)  # type: ignore[arg-type]


def absorb(progress: StreamProgress, response: worker_pb2.GenerateResponse,
           worker_id: str) -> worker_pb2.GenerateResponse | None:
    """StreamProgress.absorb between the worker's and the client's protobuf frames."""
    out = progress.absorb(convert.frame(response), worker_id)
    return None if out is None else convert.generate_response(out)


def test_stream_progress_stitches_a_migration() -> None:
    req = worker_pb2.GenerateRequest(sampling=common_pb2.SamplingParams(max_tokens=5),
                                     hints=common_pb2.AgentHints(osl=5))
    progress = StreamProgress(convert.proxy_request(req, token_bytes.pack([1, 2, 3])))
    first = absorb(progress, frame([7, 8], prompt=worker_pb2.PromptInfo(prompt_tokens=3, cached_tokens=2)), "a")
    assert first is not None and first.prompt.worker_id == "a"
    attempt = progress.next_attempt()
    retry = convert.worker_request(req, attempt)
    assert token_bytes.unpack(attempt.tokens) == [1, 2, 3, 7, 8] and not retry.token_ids_u32  # sent beside it
    assert retry.sampling.max_tokens == 3 and retry.hints.osl == 3
    assert retry.continued_tokens == 2  # the worker is told which prompt tokens were generated
    again = absorb(progress, frame([9], prompt=worker_pb2.PromptInfo(prompt_tokens=5, cached_tokens=4)), "b")
    assert again is not None and not again.HasField("prompt")
    last = absorb(progress, frame([10, 11], finish_reason=common_pb2.FINISH_REASON_LENGTH,
                                 usage=common_pb2.Usage(prompt_tokens=5, completion_tokens=3)), "b")
    assert last is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.cached_tokens) == (3, 5, 2)
    assert progress.generated == [7, 8, 9, 10, 11]


def test_prefill_only_streams_no_tokens() -> None:
    req = worker_pb2.GenerateRequest(prefill_only=True, target_worker_id="a")
    progress = StreamProgress(convert.proxy_request(req, token_bytes.pack([1, 2, 3])))
    sent = convert.worker_request(req, progress.next_attempt())
    assert sent.sampling.max_tokens == 1 and not sent.prefill_only and not sent.target_worker_id
    out = absorb(progress, frame([5], finish_reason=common_pb2.FINISH_REASON_LENGTH,
                                usage=common_pb2.Usage(prompt_tokens=3, completion_tokens=1)), "a")
    assert out is not None and not out.token_ids and out.usage.completion_tokens == 0
