"""The mocker engine: a simulated LLM engine with a real paged KV cache and continuous batching.

One asyncio task runs the step loop: schedule (``scheduler.py``), sleep the modelled step time
(``timing.py``), deliver each request's token to its buffer. ``generate`` drains a request's buffer
into one :class:`EngineOutput` per read, so a slow consumer gets fewer, bigger outputs.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field, replace

import structlog

from services.common.errors import ContextLengthError, InternalError, InvalidRequestError, as_mesh_error
from services.common.model_dir import ModelDir
from services.worker.engine import (
    BatchingConfig,
    EngineInfo,
    EngineOutput,
    EngineRequest,
    EngineStats,
    KvEvent,
)
from services.worker.kv_feed import KvEventFeed
from services.worker.mocker.block_manager import BlockManager
from services.worker.mocker.request import MockRequest
from services.worker.mocker.scheduler import Scheduler, StepPlan
from services.worker.mocker.script import FillerText, FillerVocabulary, Script, TokenSource, filler_seed
from services.worker.mocker.stops import StopStringMatcher
from services.worker.mocker.timing import StepTiming, TimingModel

log = structlog.get_logger()


@dataclass(frozen=True)
class MockerConfig(BatchingConfig):
    """Knobs of the simulated engine: batching limits plus filler seed and timing model."""

    seed: int = 0
    timing: StepTiming = field(default_factory=TimingModel)  # or DynamoTiming (``--timing-model dynamo``)


class MockerEngine:
    """Implements :class:`services.worker.engine.Engine` without a GPU (see module docstring)."""

    name = "mocker"

    def __init__(self, config: MockerConfig, model: ModelDir, script: Script | None = None) -> None:
        self.config = config
        self.model = model
        self.script = script
        self._feed = KvEventFeed()
        self.blocks = BlockManager(config.num_blocks, config.block_size, self._feed.emit)
        self.scheduler = Scheduler(self.blocks, config.max_num_seqs, config.max_num_batched_tokens)
        self._vocab = FillerVocabulary(model.tokenizer)
        self._requests: dict[str, MockRequest] = {}
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.steps = 0

    # -- Engine contract ------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="mocker-step-loop")

    async def close(self) -> None:
        self._closed = True
        for req in list(self._requests.values()):
            self._release(req)
            req.finish("cancelled")
        self._wakeup.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._feed.close()

    async def abort(self, request_id: str) -> None:
        req = self._requests.get(request_id)
        if req is not None:
            self._release(req)
            req.finish("cancelled")

    def kv_events(self) -> AsyncIterator[list[KvEvent]]:
        return self._feed.subscribe()

    def info(self) -> EngineInfo:
        return EngineInfo(self.name, self.model.name, self.config.block_size, self.config.num_blocks,
                          self.model.max_model_len)

    def stats(self) -> EngineStats:
        s = self.scheduler
        return EngineStats(
            active_requests=len(s.running) + len(s.waiting),
            running_requests=len(s.running),
            waiting_requests=len(s.waiting),
            active_blocks=self.blocks.active_blocks,
            cached_blocks=self.blocks.cached_blocks,
            total_blocks=self.blocks.total_blocks,
            block_size=self.blocks.block_size,
            steps=self.steps,
            preemptions=s.preemptions,
        )

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        req = self._new_request(request)
        self._requests[req.request_id] = req
        self.scheduler.add(req)
        self._wakeup.set()
        try:
            while True:
                out = req.take_output()
                if out is not None:
                    yield out
                    if out.finish_reason is not None:
                        return
                    continue
                if req.error is not None:
                    raise req.error
                req.ready.clear()
                await req.ready.wait()
        finally:
            self._release(req)

    def clear_kv_cache(self) -> bool:
        """Drop every cached (unreferenced) block; refused while requests hold blocks."""
        return self.blocks.clear()

    # -- internals ------------------------------------------------------------------------------

    def _new_request(self, request: EngineRequest) -> MockRequest:
        if self._closed or self._task is None:
            raise InternalError("the engine is not running")
        if not request.request_id:
            request = _with_id(request)
        if request.request_id in self._requests:
            raise InvalidRequestError(f"request id {request.request_id!r} is already running", param="request_id")
        prompt_len = len(request.token_ids)
        if prompt_len == 0:
            raise InvalidRequestError("the prompt has no tokens", param="token_ids")
        if request.max_tokens < 0:
            raise InvalidRequestError("max_tokens must not be negative", param="max_tokens")
        max_len = self.model.max_model_len
        capacity = self.config.num_blocks * self.config.block_size
        if prompt_len >= max_len:
            raise ContextLengthError(
                f"the prompt has {prompt_len} tokens; this model's context is {max_len} tokens",
                param="messages")
        if prompt_len + 1 > capacity:
            raise ContextLengthError(
                f"the prompt has {prompt_len} tokens; this worker's KV cache holds {capacity - 1}",
                param="messages")
        max_tokens = min(request.max_tokens or self.config.max_tokens_default, max_len - prompt_len)
        stop_ids = set(request.stop_token_ids)
        if not request.ignore_eos:
            stop_ids.update(self.model.eos_token_ids)
        scripted: list[int] = []
        if self.script is not None:
            entry = self.script.lookup(request.match_text)
            if entry is not None:
                scripted = self.model.tokenizer.encode(entry.completion, add_special_tokens=False).ids
        eos = self.model.eos_token_ids[0] if self.model.eos_token_ids else None
        filler = FillerText(self._vocab, filler_seed(request.token_ids, self.config.seed, request.seed))
        return MockRequest(
            request,
            max_tokens=max_tokens,
            stop_ids=frozenset(stop_ids),
            source=TokenSource(scripted, eos, filler),
            matcher=StopStringMatcher(self.model.tokenizer, request.stop),
        )

    def _release(self, req: MockRequest) -> None:
        if self._requests.get(req.request_id) is req:
            del self._requests[req.request_id]
            self.scheduler.remove(req)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        step_start: float | None = None  # when the running step began (None: idle)
        try:
            while not self._closed:
                if not self.scheduler.has_work:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    step_start = None
                    continue
                if step_start is None:
                    step_start = loop.time()
                plan = self.scheduler.schedule()
                for req in plan.finished:
                    self._release(req)
                if not plan.items and (plan.preempted or plan.finished):
                    await asyncio.sleep(0)  # queues changed: schedule again
                    continue
                if not plan.items:
                    # Nothing fits (every request waits for blocks that nobody will free): idle until
                    # a request arrives or leaves.
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    step_start = None
                    continue
                # A step lasts its modelled time, of which the CPU work since the previous step was due to
                # end (delivering its tokens, a late wake-up, scheduling this one) is a part: the clock then
                # follows the model at any --speedup until the CPU work alone exceeds a step.
                modelled = self.config.timing.step_seconds(plan.prefills, plan.decode_batch, self.blocks.active_blocks)
                deadline = max(step_start + modelled, loop.time())
                await asyncio.sleep(max(0.0, deadline - loop.time()))
                step_start = deadline
                self.steps += 1
                self._deliver(plan)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: fail every request rather than hang them
            log.exception("worker.engine_failed")
            err = as_mesh_error(exc)
            for req in list(self._requests.values()):
                self._release(req)
                req.fail(err)

    def _deliver(self, plan: StepPlan) -> None:
        for item in plan.items:
            req = item.request
            if req.finished or item.token is None:
                continue
            req.deliver(item.token)
            if req.finished:
                self._release(req)


def _with_id(request: EngineRequest) -> EngineRequest:
    return replace(request, request_id=f"req-{uuid.uuid4().hex[:12]}")
