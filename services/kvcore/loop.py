"""The step loop on a real clock: one asyncio task drives an :class:`EngineCore` and awaits the engine's compute.

Each turn: :meth:`EngineCore.plan_step`, then ``await compute.run(plan)`` (the engine's only part:
the mocker returns at once, the torch engine runs its forwards in a thread and samples), then the
step is stretched to last at least ``compute.modelled_seconds(plan)`` (the mocker's timing model; 0
for an engine whose compute takes real time), then :meth:`EngineCore.complete_step`.

A step lasts its modelled time measured from when the previous step was due to end, so the loop's own
CPU work (delivering tokens, a late wake-up, scheduling) is part of it: the clock follows the model at
any speedup until the CPU work alone exceeds a step. Past that point (the mocker at a high speedup) the
loop lags its model, and the quiet steps that fit in the lag (known tokens decoded into held blocks) are
advanced together rather than planned and completed one by one (:meth:`StepLoop._catch_up`): the same tokens
and clock, a fraction of the CPU. When nothing can run, the loop sleeps until a request arrives or leaves.

The request lifecycle lives here too: :meth:`generate` queues a request and streams its outputs,
and closing or cancelling that stream releases the request (its blocks freed) in ``finally``;
:meth:`abort` ends one request with ``cancelled``, :meth:`close` all of them and the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Protocol

from services.common.errors import InternalError, as_mesh_error
from services.kvcore.core import EngineCore
from services.kvcore.domain import EngineOutput
from services.kvcore.request import CoreRequest
from services.kvcore.scheduler import StepPlan
from services.kvcore.timing import StepTiming


class StepCompute(Protocol):
    """What an engine supplies to the loop: the compute of one planned step."""

    def modelled_seconds(self, plan: StepPlan) -> float:
        """The least wall time the step takes (a simulated engine's model; 0: as long as ``run`` takes)."""
        ...

    async def run(self, plan: StepPlan) -> Sequence[int | None]:
        """Compute the step; the token generated for each item not known in advance (``()``: none)."""
        ...


class ModelledCompute:
    """The compute of a simulated engine: no work, a step lasts what ``timing`` says (the mocker's)."""

    def __init__(self, timing: StepTiming) -> None:
        self.timing = timing

    def modelled_seconds(self, plan: StepPlan) -> float:
        return plan.modelled_seconds(self.timing)

    async def run(self, plan: StepPlan) -> Sequence[int | None]:
        return ()


class StepLoop:
    """Runs ``core`` on the event loop's clock with ``compute`` (see module docstring)."""

    def __init__(
        self, core: EngineCore, compute: StepCompute, *, name: str,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.core = core
        self.compute = compute
        self.name = name
        self._on_failure = on_failure
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def running(self) -> bool:
        return self._task is not None and not self._closed

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"{self.name}-step-loop")

    async def close(self) -> None:
        """Every request ends with ``cancelled``; the loop stops."""
        self._closed = True
        self.core.cancel_all()
        self._wakeup.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def abort(self, request_id: str) -> None:
        if self.core.abort(request_id):
            self._wakeup.set()

    async def generate(self, req: CoreRequest) -> AsyncGenerator[EngineOutput, None]:
        """Queue ``req`` and stream its outputs; leaving the stream early releases it."""
        if not self.running:
            raise InternalError("the engine is not running")
        self.core.add(req)
        self._wakeup.set()
        try:
            async for out in req.outputs():
                yield out
        finally:
            self.core.release(req)
            self._wakeup.set()

    def _catch_up(self, clock: float, now: float) -> float:
        """The model's clock after the quiet steps that fit between it (``clock``) and ``now``, run at once.

        A simulated engine whose steps cost more CPU than the model gives them (the mocker at a high speedup: a
        decode step of ~6 us costs ~10 us of Python) lags its model; each step it plans and completes one by one
        then only spends CPU that the rest of the mesh waits for. While it lags by at least one decode-only step,
        the quiet ones among the next (``EngineCore.quiet_steps``: known tokens decoded into held blocks; no block
        taken, no event, no first token, no end) are advanced together, as the replay simulator does; their
        tokens and the model's clock are what the step-by-step loop reaches. An engine whose tokens are not
        known in advance, or whose steps the model does not time, has none.
        """
        if not self.core.scheduler.running:
            return clock
        step = self.compute.modelled_seconds(self.core.quiet_step_plan())
        if step <= 0 or now - clock < step:
            return clock
        quiet = self.core.quiet_steps()  # a positive answer commits us to advancing at least one
        if not quiet:
            return clock
        steps = min(quiet, int((now - clock) / step))
        self.core.advance_quiet(steps)
        return clock + steps * step

    async def _idle(self) -> None:
        self._wakeup.clear()
        await self._wakeup.wait()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        step_start: float | None = None  # when the running step began (None: idle)
        try:
            while not self._closed:
                if not self.core.has_work:
                    await self._idle()
                    step_start = None
                    continue
                if step_start is None:
                    step_start = loop.time()
                plan = self.core.plan_step()
                if not plan.items:
                    # Nothing fits (every request waits for blocks that nobody will free): idle until
                    # a request arrives or leaves.
                    await self._idle()
                    step_start = None
                    continue
                deadline = max(step_start + self.compute.modelled_seconds(plan), loop.time())
                sampled = await self.compute.run(plan)
                await asyncio.sleep(max(0.0, deadline - loop.time()))
                step_start = deadline
                self.core.complete_step(plan, sampled)
                step_start = self._catch_up(step_start, time.monotonic())  # loop.time() moves in whole ms
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: fail every request rather than hang them
            if self._on_failure is not None:
                self._on_failure(exc)
            self.core.fail_all(as_mesh_error(exc))
