"""The engine core: block manager, scheduler and live requests behind one synchronous step contract.

A step is two calls, with the engine's compute (or the simulated clock) in between::

    plan = core.plan_step()          # schedule; blocks for the step are taken now
    ...                              # compute: sleep the modelled time, run forwards, or advance a clock
    done = core.complete_step(plan, sampled)   # deliver each item's token; finished requests leave

Nothing here awaits or reads a clock: the real-clock loop (``loop.py``) and the replay simulator
(``services/replay/sim_worker.py``) drive the same core. Requests leave through :meth:`release`
only (finished, aborted, failed, closed), which frees their blocks and tells ``on_release``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from services.common.block_hash import PrefixHashCache
from services.common.errors import InvalidRequestError, MeshError
from services.kvcore.block_manager import BlockManager
from services.kvcore.config import BatchingConfig
from services.kvcore.domain import KvEvent
from services.kvcore.request import CoreRequest
from services.kvcore.scheduler import Scheduler, StepPlan


@dataclass
class StepDone:
    """What a completed step changed: requests that got their first token, requests that finished."""

    first: list[CoreRequest] = field(default_factory=list)
    finished: list[CoreRequest] = field(default_factory=list)


class EngineCore:
    """One engine's KV cache, scheduler and requests (see module docstring)."""

    def __init__(
        self,
        config: BatchingConfig,
        *,
        on_event: Callable[[KvEvent], None] | None = None,
        on_release: Callable[[CoreRequest], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock``: seconds, for retention leases (the simulator passes its simulated clock)."""
        self.config = config
        self.blocks = BlockManager(config.num_blocks, config.block_size, on_event, clock)
        self.scheduler = Scheduler(self.blocks, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.retention, config.prefill_order)
        self.requests: dict[str, CoreRequest] = {}
        self.steps = 0
        # an agent's next turn continues its last prompt: hash only the blocks past the common prefix
        self.prefix_hashes = PrefixHashCache(config.block_size)
        self._on_release = on_release

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    # -- requests in and out ----------------------------------------------------------------------

    def add(self, req: CoreRequest) -> None:
        """Queue ``req``; its id must not be live already."""
        if req.request_id in self.requests:
            raise InvalidRequestError(f"request id {req.request_id!r} is already running", param="request_id")
        if not req.seq.known:
            request = req.request
            req.seq.known = self.prefix_hashes.hashes(request.packed or request.token_ids, request.cache_salt)
        self.requests[req.request_id] = req
        self.scheduler.add(req)

    def release(self, req: CoreRequest) -> None:
        """``req`` leaves (finished, aborted, failed): blocks freed, ``on_release`` told. Idempotent."""
        if self.requests.get(req.request_id) is req:
            del self.requests[req.request_id]
            self.scheduler.remove(req)
            if self._on_release is not None:
                self._on_release(req)

    def abort(self, request_id: str) -> bool:
        """End a live request with ``cancelled``; False when there is none by that id."""
        req = self.requests.get(request_id)
        if req is None:
            return False
        self.release(req)
        req.finish("cancelled")
        return True

    def cancel_all(self) -> None:
        """Every live request ends with ``cancelled`` (the engine closes)."""
        for req in list(self.requests.values()):
            self.release(req)
            req.finish("cancelled")

    def fail_all(self, error: MeshError) -> None:
        """Every live request ends with ``error`` (the step loop broke)."""
        for req in list(self.requests.values()):
            self.release(req)
            req.fail(error)

    # -- the step contract ------------------------------------------------------------------------

    def plan_step(self) -> StepPlan:
        """Schedule the next step (rescheduling while only preemptions or finishes happen).

        The plan's ``items`` are empty when nothing can run now (no work, or every request waits
        for blocks that only an arrival or a departure can change); ``finished`` lists the requests
        that ended while planning (no KV room at all), already released.
        """
        finished: list[CoreRequest] = []
        plan = StepPlan()
        while self.scheduler.has_work:
            plan = self.scheduler.schedule()
            for req in plan.finished:
                self.release(req)
            finished.extend(plan.finished)
            if plan.items or not (plan.preempted or plan.finished):
                break
        plan.finished = finished
        return plan

    def quiet_steps(self) -> int:
        """How many next steps only decode known tokens into held blocks (:meth:`Scheduler.quiet_steps`).

        A positive answer commits the caller to :meth:`advance_quiet` by at least one step next."""
        return self.scheduler.quiet_steps()

    def quiet_step_plan(self) -> StepPlan:
        """What each quiet step computes, for its modelled time: one decode of every running request, at this KV
        use (neither changes during a quiet stretch)."""
        return StepPlan(decode_batch=len(self.scheduler.running), active_blocks=self.blocks.active_blocks)

    def advance_quiet(self, steps: int) -> None:
        """Plan and complete ``steps`` quiet steps at once (a simulated clock: no compute runs between them)."""
        self.scheduler.advance_quiet(steps)
        self.steps += steps

    def decode_stretch(self, step_ms: Callable[[int], float], start: float, horizon: float,
                       events_ready: Callable[[], None], *, first: bool) -> tuple[int, float, StepPlan | None]:
        """The next quiet and plain steps in one pass (:meth:`Scheduler.decode_stretch`): (steps, the last one's end,
        None), or a plan that admits the waiting request after them, to complete as :meth:`plain_step`'s."""
        steps, end, admits = self.scheduler.decode_stretch(step_ms, start, horizon, events_ready, first=first)
        self.steps += steps
        return steps, end, admits

    def plain_step(self) -> StepPlan | None:
        """Schedule and complete the next step at once when it only decodes (:meth:`Scheduler.plain_step`).

        None: it does not (nothing done). A plan without items: it was taken and completed (its tokens
        delivered; nobody got a first token or finished). A plan with items: it admits a waiting request
        after all, and is :meth:`plan_step`'s plan, to complete with :meth:`complete_step`.
        """
        plan = self.scheduler.plain_step()
        if plan is not None and not plan.items:
            self.steps += 1
        return plan

    def complete_step(self, plan: StepPlan, sampled: Sequence[int | None] = ()) -> StepDone:
        """The step's compute is done: deliver each item's token (``plan`` order).

        An item's token is the one known in advance (``item.token``) or else ``sampled[i]``, the one
        the compute generated for item ``i`` (``None`` where it generated none). Items of requests
        that ended meanwhile (aborted) are skipped.
        """
        self.steps += 1
        done = StepDone()
        for i, item in enumerate(plan.items):
            req = item.request
            token = item.token if item.token is not None else (sampled[i] if i < len(sampled) else None)
            if req.finished or not item.samples or token is None:
                continue
            fresh = req.generated == 0
            req.deliver(token)
            if fresh:
                done.first.append(req)
            if req.finished:
                self.release(req)
                done.finished.append(req)
        return done
