"""A simulated worker: the engine core every engine runs (``services/kvcore``), stepped by the simulator's clock.

No asyncio loop runs here: :meth:`SimWorker.start_step` plans one step with
:meth:`~services.kvcore.core.EngineCore.plan_step` (exactly as the mocker engine's loop does) and returns
its duration under the mocker's timing model; :meth:`SimWorker.finish_step` completes it with
:meth:`~services.kvcore.core.EngineCore.complete_step` when the simulated clock reaches the step's end.
KV events go to ``on_events`` at the end of the step (a request arriving mid-step cannot see that
step's blocks, as in Dynamo's mocker).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from services.common.model_dir import ModelDir
from services.kvcore.config import BatchingConfig
from services.kvcore.core import EngineCore
from services.kvcore.domain import EngineRequest, KvEvent
from services.kvcore.outputs import CheckedRequest
from services.kvcore.request import CoreRequest
from services.kvcore.scheduler import StepPlan
from services.kvcore.timing import DynamoTiming
from services.kvcore.tokens import FillerText, FillerVocabulary, TokenSource


@dataclass(frozen=True)
class SimWorkerConfig(BatchingConfig):
    """Capacity and batching limits of each simulated worker: the core's, with Dynamo mocker's defaults."""

    block_size: int = 64
    max_num_seqs: int = 256


_DONE = StepPlan()  # the running "step" is a run of steps taken and completed already


class SimWorker:
    """One worker's engine core under simulated time (see module docstring)."""

    def __init__(
        self, worker_id: str, config: SimWorkerConfig, timing: DynamoTiming, model: ModelDir,
        vocab: FillerVocabulary, on_events: Callable[[str, list[KvEvent]], None],
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``clock``: simulated seconds (retention leases)."""
        self.worker_id = worker_id
        self.config = config
        # the live mocker's exact call (``--timing-model dynamo``), on this worker's capacity
        self._timing = replace(timing, num_blocks=config.num_blocks)
        self._model = model
        self._vocab = vocab
        self._on_events = on_events
        self._pending: list[KvEvent] = []
        self._ready = 0  # how many of them a decode stretch said may go out (see _events_ready)
        self.core = EngineCore(config, on_event=self._pending.append, clock=clock or time.monotonic)
        self.blocks = self.core.blocks
        self.scheduler = self.core.scheduler
        self.plan: StepPlan | None = None
        self.finished_early: list[CoreRequest] = []  # ended while scheduling (no KV room at all)
        self._decode_ms_memo: dict[tuple[int, int], float] = {}  # (batch, active blocks) -> a decode step's ms

    def add(self, request_id: str, tokens: Sequence[int], max_tokens: int,
            block_hashes: list[int] | None = None) -> CoreRequest:
        """Queue a request; ``block_hashes`` (the prompt's, at this worker's block size) spare hashing it again.

        ``tokens`` must not change afterwards: the core keeps them as they are (``share_prompt``)."""
        engine_request = EngineRequest(request_id, tokens, max_tokens=max_tokens, ignore_eos=True)
        req = CoreRequest(CheckedRequest(engine_request, max_tokens, frozenset()), tokenizer=self._model.tokenizer,
                          source=TokenSource((), None, FillerText(self._vocab, len(tokens))),
                          block_hashes=block_hashes, share_prompt=True)
        self.core.add(req)
        return req

    def start_step(self, now: float, horizon: float = math.inf) -> float | None:
        """Plan the next step at ``now`` (ms); when it ends, or None when nothing can run now.

        Decode steps planned before ``horizon`` (the next arrival, which might change the batch) run as one
        event when nobody gets a first token or finishes in them: in one pass over the batch
        (``EngineCore.decode_stretch``: each request's tokens handled at its block boundaries), and a step that
        admits the waiting request before any such pass could run, as ``EngineCore.plain_step``. (Quiet steps
        need no path of their own: a stretch takes them, every request here ignores EOS.) The returned end is the
        last one's, summed step by step as the step-by-step loop would; their events reach the router before the
        next arrival, as theirs would.
        """
        end, stepped = now, False
        while not stepped or end < horizon:  # the first step starts now, the others before the next arrival
            if stepped:
                self._flush()
            steps, stretch_end, admits = self.core.decode_stretch(self._decode_ms, end, horizon, self._events_ready,
                                                                  first=not stepped)
            if admits is not None:  # its last step admits a waiting request: a real step, completed when it ends
                self._flush(self._ready)
                self.plan = admits
                return stretch_end + 1000.0 * admits.modelled_seconds(self._timing)
            if steps:
                end, stepped = stretch_end, True
                continue
            plain = self.core.plain_step()
            if plain is None:
                break
            end, stepped = end + 1000.0 * plain.modelled_seconds(self._timing), True
            if plain.items:  # it admits a waiting request: a real step, completed when it ends
                self.plan = plain
                return end
        if stepped:
            self._flush(self._ready)  # all but the last step's: those reach the router when it ends
            self.plan = _DONE
            return end
        plan = self.core.plan_step()
        self.finished_early.extend(plan.finished)
        self.plan = plan if plan.items else None
        return now + 1000.0 * plan.modelled_seconds(self._timing) if plan.items else None

    def _decode_ms(self, active_blocks: int) -> float:
        """How long a step that only decodes the running batch lasts (ms) at ``active_blocks`` blocks in use."""
        key = (len(self.scheduler.running), active_blocks)
        ms = self._decode_ms_memo.get(key)
        if ms is None:
            if len(self._decode_ms_memo) >= 1 << 14:
                self._decode_ms_memo.clear()
            ms = self._decode_ms_memo[key] = 1000.0 * StepPlan(
                decode_batch=key[0], active_blocks=active_blocks).modelled_seconds(self._timing)
        return ms

    def _events_ready(self) -> None:
        """The events so far may reach the router: a step after theirs has begun (a decode stretch says so)."""
        self._ready = len(self._pending)

    def _flush(self, upto: int | None = None) -> None:
        """Hand the router the pending events (only the first ``upto`` of them when given)."""
        pending = self._pending
        count = len(pending) if upto is None else upto
        if count:
            events = pending[:count]
            del pending[:count]
            self._on_events(self.worker_id, events)
        self._ready = 0

    def finish_step(self) -> tuple[list[CoreRequest], list[CoreRequest]]:
        """Deliver the running step: (requests that got their first token, requests that finished)."""
        plan, self.plan = self.plan, None
        first: list[CoreRequest] = []
        done: list[CoreRequest] = []
        if plan is not None and plan is not _DONE:
            step = self.core.complete_step(plan)
            first, done = step.first, step.finished
        self._flush()
        return first, done
