"""A simulated worker: the mocker's own block manager, scheduler and request type, stepped by the simulator.

No asyncio loop runs here: :meth:`SimWorker.start_step` plans one engine step (exactly as the mocker
engine's loop does) and returns its duration; :meth:`SimWorker.finish_step` delivers its tokens when the
simulated clock reaches the step's end. KV events go to ``on_events`` at the end of the step (a request
arriving mid-step cannot see that step's blocks, as in Dynamo's mocker).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from services.common.model_dir import ModelDir
from services.worker.engine import EngineRequest, KvEvent
from services.worker.mocker.block_manager import BlockManager
from services.worker.mocker.request import MockRequest
from services.worker.mocker.scheduler import Scheduler, StepPlan
from services.worker.mocker.script import FillerText, FillerVocabulary, TokenSource
from services.worker.mocker.stops import StopStringMatcher
from services.worker.mocker.timing import DynamoTiming


@dataclass(frozen=True)
class SimWorkerConfig:
    """Capacity and batching limits of each simulated worker."""

    block_size: int = 64
    num_blocks: int = 16384
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192


class SimWorker:
    """One worker's engine core under simulated time (see module docstring)."""

    def __init__(
        self, worker_id: str, config: SimWorkerConfig, timing: DynamoTiming, model: ModelDir,
        vocab: FillerVocabulary, on_events: Callable[[str, list[KvEvent]], None],
    ) -> None:
        self.worker_id = worker_id
        self.config = config
        # the live mocker's exact call (``--timing-model dynamo``), on this worker's capacity
        self._timing = replace(timing, num_blocks=config.num_blocks)
        self._model = model
        self._vocab = vocab
        self._on_events = on_events
        self._pending: list[KvEvent] = []
        self.blocks = BlockManager(config.num_blocks, config.block_size, self._pending.append)
        self.scheduler = Scheduler(self.blocks, config.max_num_seqs, config.max_num_batched_tokens)
        self.plan: StepPlan | None = None
        self.finished_early: list[MockRequest] = []  # ended while scheduling (no KV room at all)

    def add(self, request_id: str, tokens: list[int], max_tokens: int) -> MockRequest:
        engine_request = EngineRequest(request_id, tokens, max_tokens=max_tokens, ignore_eos=True)
        req = MockRequest(
            engine_request, max_tokens=max_tokens, stop_ids=frozenset(),
            source=TokenSource((), None, FillerText(self._vocab, len(tokens))),
            matcher=StopStringMatcher(self._model.tokenizer, ()),
        )
        self.scheduler.add(req)
        return req

    def start_step(self) -> float | None:
        """Plan the next step; its duration in ms, or None when nothing can run now."""
        while self.scheduler.has_work:
            plan = self.scheduler.schedule()
            for req in plan.finished:
                self.scheduler.remove(req)
            self.finished_early.extend(plan.finished)
            if plan.items:
                self.plan = plan
                return 1000.0 * self._timing.step_seconds(plan.prefills, plan.decode_batch, self.blocks.active_blocks)
            if not (plan.preempted or plan.finished):
                break
        self.plan = None
        return None

    def finish_step(self) -> tuple[list[MockRequest], list[MockRequest]]:
        """Deliver the running step: (requests that got their first token, requests that finished)."""
        plan, self.plan = self.plan, None
        first: list[MockRequest] = []
        done: list[MockRequest] = []
        if plan is not None:
            for item in plan.items:
                req = item.request
                if req.finished or item.token is None:
                    continue
                fresh = req.generated == 0
                req.deliver(item.token)
                if fresh:
                    first.append(req)
                if req.finished:
                    self.scheduler.remove(req)
                    done.append(req)
        if self._pending:
            events, self._pending[:] = list(self._pending), []
            self._on_events(self.worker_id, events)
        return first, done
