"""The router's retry / migration decisions (``services/router/proxy.py``) over fake worker streams: no gRPC."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from services.common import token_bytes
from services.common.errors import InvalidRequestError, MeshError, UnavailableError
from services.router.index import KvIndex
from services.router.policy import PlacementPolicy
from services.router.proxy import Proxy, ProxyLimits, RequestRejected, WorkerFailure
from services.router.registry import WorkerEndpoint, WorkerRegistry
from services.router.router import Router
from services.router.stream import AttemptRequest, Frame, PromptInfo, ProxyRequest, Usage

PROMPT = (1, 2, 3, 4)


def attempt(tokens: tuple[int, ...], max_tokens: int) -> AttemptRequest:
    """The attempt for ``tokens``: the prompt plus (a migration) the tokens generated so far."""
    return AttemptRequest(token_bytes.pack(tokens), max_tokens, 0, continued=len(tokens) - len(PROMPT))


class Hang:
    """Script step: the worker goes silent until the attempt is cancelled."""


HANG = Hang()
Step = Frame | Exception | Hang


@dataclass
class FakeStream:
    """One attempt: plays its script; the end of the script is the end of the stream."""

    script: list[Step]
    hung: asyncio.Event
    cancelled: bool = False
    drained: bool = False
    _pending: asyncio.Future[None] | None = None

    async def read(self) -> Frame | None:
        if self.cancelled:
            raise asyncio.CancelledError
        if not self.script:
            return None
        step = self.script.pop(0)
        if isinstance(step, Hang):
            self._pending = asyncio.get_running_loop().create_future()
            self.hung.set()
            await self._pending  # cancel() cancels it: the read raises CancelledError, as gRPC's does
            raise AssertionError("unreachable")
        if isinstance(step, Exception):
            raise step
        return step

    async def drain(self) -> None:
        self.drained = True

    def cancel(self) -> None:
        self.cancelled = True
        if self._pending is not None:
            self._pending.cancel()


@dataclass
class FakeWorkers:
    """Each worker plays its scripts, one per attempt it gets; ``opened`` records every attempt."""

    scripts: dict[str, list[list[Step]]]
    opened: list[tuple[str, AttemptRequest]] = field(default_factory=list)
    streams: list[FakeStream] = field(default_factory=list)
    hung: asyncio.Event = field(default_factory=asyncio.Event)  # some stream went silent

    def open(self, endpoint: WorkerEndpoint, attempt: AttemptRequest) -> FakeStream:
        self.opened.append((endpoint.worker_id, attempt))
        stream = FakeStream(self.scripts[endpoint.worker_id].pop(0), self.hung)
        self.streams.append(stream)
        return stream

    @property
    def workers(self) -> list[str]:
        return [wid for wid, _ in self.opened]


def make_proxy(workers: Sequence[str] = ("a", "b", "c"), **limits: Any) -> Proxy:
    registry = WorkerRegistry(60.0)
    for wid in workers:
        registry.heartbeat(WorkerEndpoint(wid, f"{wid}:1", 16, 100))
    # Equal costs and loads: placement tries the workers in name order.
    return Proxy(Router(KvIndex(), registry, PlacementPolicy("kv", 1.0)), ProxyLimits(**limits))


def tokens(*ids: int, worker: str = "") -> Frame:
    return Frame(token_ids=ids, prompt=PromptInfo(len(PROMPT), 0, worker) if worker else None)


def last(*ids: int, completion: int) -> Frame:
    return Frame(token_ids=ids, finish_reason="length", usage=Usage(completion_tokens=completion))


async def run(proxy: Proxy, workers: FakeWorkers, max_tokens: int = 5, *, on_first: object = None,
              ) -> tuple[list[Frame], MeshError | None]:
    out: list[Frame] = []
    try:
        async for frame in proxy.run(ProxyRequest("r1", token_bytes.pack(PROMPT), max_tokens=max_tokens), workers):
            out.append(frame)
            if len(out) == 1 and callable(on_first):
                on_first()
    except MeshError as err:
        return out, err
    return out, None


def sent_tokens(frames: list[Frame]) -> list[int]:
    return [t for f in frames for t in f.token_ids]


def idle(proxy: Proxy) -> bool:
    return all(proxy.router.registry.load(ep.worker_id).requests == 0 for ep in proxy.router.registry.endpoints())


async def test_a_worker_failing_before_its_first_frame_is_replaced() -> None:
    proxy = make_proxy()
    workers = FakeWorkers({"a": [[WorkerFailure("connection refused")]],
                           "b": [[tokens(7, 8, worker="b"), last(9, 10, 11, completion=5)]]})
    frames, err = await run(proxy, workers)
    assert err is None
    assert workers.opened == [("a", attempt(PROMPT, 5)), ("b", attempt(PROMPT, 5))]
    assert sent_tokens(frames) == [7, 8, 9, 10, 11]
    assert frames[0].prompt == PromptInfo(4, 0, "b")
    assert frames[-1].usage == Usage(prompt_tokens=4, completion_tokens=5) and frames[-1].finish_reason == "length"
    assert workers.streams[1].drained and idle(proxy)


async def test_retries_stop_after_max_retries() -> None:
    proxy = make_proxy(max_retries=1)
    workers = FakeWorkers({w: [[WorkerFailure(f"{w} down")]] for w in ("a", "b", "c")})
    frames, err = await run(proxy, workers)
    assert frames == [] and workers.workers == ["a", "b"]
    assert isinstance(err, UnavailableError) and err.message == "worker b failed: b down"
    assert idle(proxy)


async def test_no_worker_left_is_unavailable() -> None:
    proxy = make_proxy(workers=("a",))
    workers = FakeWorkers({"a": [[WorkerFailure("down")]]})
    _, err = await run(proxy, workers)
    assert isinstance(err, UnavailableError) and err.message == "no worker left to take the request (tried ['a'])"


async def test_mid_stream_failure_migrates_with_the_tokens_so_far() -> None:
    proxy = make_proxy()
    workers = FakeWorkers({
        "a": [[tokens(7, worker="a"), tokens(8), WorkerFailure("worker crashed")]],
        "b": [[tokens(9, worker="b"), last(10, completion=2)]],
    })
    frames, err = await run(proxy, workers)
    assert err is None
    assert workers.opened == [("a", attempt(PROMPT, 5)), ("b", attempt((*PROMPT, 7, 8), 3))]
    assert [f.token_ids for f in frames] == [(7,), (8,), (9,), (10,)]
    assert [f.prompt for f in frames] == [PromptInfo(4, 0, "a"), None, None, None]  # the first worker's only
    assert frames[-1].usage == Usage(prompt_tokens=4, completion_tokens=4)
    assert workers.streams[0].cancelled and idle(proxy)


async def test_migration_limit_reached_is_an_error_after_the_frames_sent() -> None:
    proxy = make_proxy(migration_limit=1)
    workers = FakeWorkers({
        "a": [[tokens(7, worker="a"), WorkerFailure("a crashed")]],
        "b": [[tokens(8, worker="b"), WorkerFailure("b crashed")]],
        "c": [[last(9, completion=1)]],
    })
    frames, err = await run(proxy, workers)
    assert sent_tokens(frames) == [7, 8] and workers.workers == ["a", "b"]
    assert isinstance(err, UnavailableError)
    assert err.message == "worker b failed mid-stream (b crashed); migration limit 1 reached"


async def test_migration_disabled_fails_at_the_first_mid_stream_failure() -> None:
    proxy = make_proxy(migration_limit=0)
    workers = FakeWorkers({"a": [[tokens(7, worker="a"), WorkerFailure("a crashed")]], "b": [[last(8, completion=1)]]})
    frames, err = await run(proxy, workers)
    assert sent_tokens(frames) == [7] and workers.workers == ["a"]
    assert isinstance(err, UnavailableError) and "migration limit 0 reached" in err.message


async def test_a_failure_after_every_allowed_token_finishes_instead_of_migrating() -> None:
    proxy = make_proxy()
    workers = FakeWorkers({"a": [[tokens(7, 8, worker="a"), WorkerFailure("gone")]], "b": [[last(9, completion=1)]]})
    frames, err = await run(proxy, workers, max_tokens=2)
    assert err is None and workers.workers == ["a"]
    assert frames[-1] == Frame(finish_reason="length", usage=Usage(prompt_tokens=4, completion_tokens=2))


async def test_a_rejected_request_is_not_retried() -> None:
    proxy = make_proxy()
    bad = InvalidRequestError("temperature must be >= 0", param="temperature")
    workers = FakeWorkers({"a": [[RequestRejected(bad)]], "b": [[last(7, completion=1)]]})
    frames, err = await run(proxy, workers)
    assert frames == [] and err is bad and workers.workers == ["a"]
    assert idle(proxy)


async def test_in_band_errors_of_the_request_pass_through_and_of_the_worker_retry() -> None:
    proxy = make_proxy()
    refused = Frame(error=InvalidRequestError("no such stop token"))
    workers = FakeWorkers({"a": [[Frame(error=UnavailableError("draining"))]], "b": [[refused]]})
    frames, err = await run(proxy, workers)
    assert err is None and workers.workers == ["a", "b"]
    assert frames == [refused] and workers.streams[1].drained


async def test_a_stalled_worker_is_forgotten_and_its_request_migrates() -> None:
    proxy = make_proxy(stall_timeout=0.05)
    workers = FakeWorkers({"a": [[tokens(7, worker="a"), HANG]], "b": [[last(8, 9, completion=2)]]})
    frames, err = await run(proxy, workers)
    assert err is None
    assert proxy.router.registry.get("a") is None and proxy.router.registry.get("b") is not None
    assert workers.opened == [("a", attempt(PROMPT, 5)), ("b", attempt((*PROMPT, 7), 4))]
    assert sent_tokens(frames) == [7, 8, 9] and frames[-1].usage == Usage(prompt_tokens=4, completion_tokens=3)


async def test_worker_gone_abandons_its_attempts_and_they_migrate() -> None:
    proxy = make_proxy(stall_timeout=30.0)
    workers = FakeWorkers({"a": [[tokens(7, worker="a"), HANG]], "b": [[last(8, completion=1)]]})
    loop = asyncio.get_running_loop()
    frames, err = await asyncio.wait_for(
        run(proxy, workers, on_first=lambda: loop.call_later(0.01, proxy.worker_gone, "a")), 5)
    assert err is None and workers.workers == ["a", "b"]
    assert workers.streams[0].cancelled
    assert proxy.router.registry.get("a") is not None  # not forgotten here: its heartbeat expiry does that
    assert sent_tokens(frames) == [7, 8] and frames[-1].usage == Usage(prompt_tokens=4, completion_tokens=2)


async def test_client_cancellation_is_not_a_worker_failure() -> None:
    proxy = make_proxy()
    workers = FakeWorkers({"a": [[tokens(7, worker="a"), HANG]], "b": [[last(8, completion=1)]]})
    task = asyncio.create_task(run(proxy, workers))
    await asyncio.wait_for(workers.hung.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert workers.workers == ["a"] and workers.streams[0].cancelled and idle(proxy)


async def test_a_first_frame_overdue_moves_the_request_to_another_worker() -> None:
    """A worker whose first frame is far later than its recent ones (engine stuck, process alive) loses the
    request to the next worker within ~2x its history + 1 s, long before the stall timeout; it stays in the
    registry (it may just be slow), and a worker with no history is never judged."""
    proxy = make_proxy(("a", "b"), stall_timeout=60.0)
    proxy.first_frames.observe("a", 1, 0.01)  # a's first frames take ~10 ms
    workers = FakeWorkers({"a": [[HANG]], "b": [[tokens(7, 8, worker="b"), last(9, completion=3)]]})
    started = asyncio.get_running_loop().time()
    frames, err = await run(proxy, workers)
    assert err is None and workers.workers == ["a", "b"] and sent_tokens(frames) == [7, 8, 9]
    assert asyncio.get_running_loop().time() - started < 3.0  # 2 x 10 ms + 1 s, not 60 s
    assert proxy.router.registry.get("a") is not None and idle(proxy)


async def test_no_first_frame_deadline_without_history_or_another_worker() -> None:
    proxy = make_proxy(("a", "b"))
    assert proxy.first_frames.timeout("a", 10) is None  # never judged on a guess
    proxy.first_frames.observe("a", 2, 0.1)
    assert proxy.first_frames.timeout("a", 1) == pytest.approx(2 * 0.1 + 1.0)
    assert proxy.first_frames.timeout("a", 20) == pytest.approx(2 * 0.05 * 20 + 1.0)  # scaled to the work ahead
    assert make_proxy(("a", "b"), first_frame_timeout=2.5).first_frames.timeout("a", 10) == 2.5  # fixed
    alone = make_proxy(("a",), stall_timeout=0.3)
    alone.first_frames.observe("a", 1, 0.001)
    workers = FakeWorkers({"a": [[HANG]]})
    started = asyncio.get_running_loop().time()
    _, err = await run(alone, workers)
    assert isinstance(err, UnavailableError)
    assert asyncio.get_running_loop().time() - started >= 0.3  # the stall timeout, not the first-frame one
