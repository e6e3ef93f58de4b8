"""Continuous batching for the mocker: which requests run in the next step, and with how many tokens.

Policy (vLLM V1-like, synchronous and free of I/O so it is unit-testable):

1. Running requests first, in admission order: a decoding request advances one token; a request
   still prefilling (chunked prefill) gets the next chunk of its prompt within the step's token
   budget (``max_num_batched_tokens``). The step that computes a prompt's last chunk also produces
   its first token.
2. If a running request cannot get a KV block, the most recently admitted running request is
   preempted: its blocks are freed (they stay cached, so its recompute usually hits the prefix
   cache) and it goes back to the front of the waiting queue with its generated tokens, to be
   prefilled again. If the starving request is itself the newest, it is the one preempted. A
   request alone in the engine that still cannot grow finishes with ``"length"``.
3. Then waiting requests are admitted FIFO while ``max_num_seqs``, the token budget and free blocks
   allow (head-of-line: the first one that does not fit stops admission), unless this step preempted.

Blocks for a step's tokens are taken when it is scheduled; the generated token of a request is
known in advance (scripted or seeded), so the KV it adds is held before the step's time passes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from services.worker.mocker.block_manager import BlockManager
from services.worker.mocker.request import MockRequest
from services.worker.mocker.timing import PrefillChunk


@dataclass
class ScheduledItem:
    """One request's share of a step."""

    request: MockRequest
    prefill_tokens: int          # prompt tokens computed this step (0 for a decode)
    token: int | None            # the token generated this step, if the prompt is complete


@dataclass
class StepPlan:
    """What one engine step computes."""

    items: list[ScheduledItem] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)
    decode_batch: int = 0
    preempted: list[MockRequest] = field(default_factory=list)
    finished: list[MockRequest] = field(default_factory=list)  # ended while scheduling (no room)


class Scheduler:
    """Waiting and running queues over a :class:`BlockManager` (see module docstring)."""

    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[MockRequest] = deque()
        self.running: list[MockRequest] = []
        self.preemptions = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: MockRequest) -> None:
        self.waiting.append(request)

    def remove(self, request: MockRequest) -> None:
        """Forget ``request`` (finished or aborted) and free its blocks. Idempotent."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.blocks.free(request.seq)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running):
            req = self.running[i]
            if budget <= 0 and req.prefilling:
                i += 1
                continue
            item = self._try_schedule(req, budget)
            if item is not None:
                plan.items.append(item)
                budget -= max(item.prefill_tokens, 1)
                i += 1
                continue
            victim = self.running[-1]
            if victim is req and len(self.running) == 1:
                self.running.pop()
                self.blocks.free(req.seq)
                req.finish("length")  # alone and still out of KV capacity
                plan.finished.append(req)
                break
            self._preempt(victim)
            plan.preempted.append(victim)
            if victim is req:
                break
        if not plan.preempted:
            while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
                req = self.waiting[0]
                cached = self.blocks.acquire_prefix(req.seq, req.all_tokens)
                item = self._try_schedule(req, budget)
                if item is None:
                    self.blocks.free(req.seq)
                    if not self.running:  # cannot fit even into an empty cache (grew past capacity)
                        self.waiting.popleft()
                        req.finish("length")
                        plan.finished.append(req)
                        continue
                    break
                self.waiting.popleft()
                req.mark_admitted(cached)
                self.running.append(req)
                plan.items.append(item)
                budget -= max(item.prefill_tokens, 1)
        for item in plan.items:
            req = item.request
            if item.prefill_tokens:
                plan.prefills.append(PrefillChunk(item.prefill_tokens, req.computed))
            else:
                plan.decode_batch += 1
        return plan

    def _try_schedule(self, req: MockRequest, budget: int) -> ScheduledItem | None:
        """Take blocks for ``req``'s share of the step; None (nothing taken) if they are not there."""
        start = req.computed
        chunk = max(0, min(len(req.all_tokens) - start, budget))
        tokens = req.all_tokens[start : start + chunk]
        token: int | None = None
        if start + chunk == len(req.all_tokens):
            token = req.source.peek()
            if token not in req.stop_ids:
                tokens = [*tokens, token]
        if not self.blocks.append(req.seq, tokens):
            return None
        return ScheduledItem(req, chunk, token)

    def _preempt(self, req: MockRequest) -> None:
        self.running.remove(req)
        self.blocks.free(req.seq)
        self.waiting.appendleft(req)
        self.preemptions += 1
