"""Continuous batching for every engine core: which requests run in the next step, with how many tokens.

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

Blocks for a step's tokens are taken when it is scheduled, so a step never runs out of room
half-way: the chunk fed to the model, plus, when the request knows its next token in advance
(:meth:`CoreRequest.lookahead`: scripted or seeded output, the mocker and the simulator), that
token too, so the KV it adds is held before the step's time passes. A request without lookahead
(the torch engine samples) feeds its sampled token as next step's one-token chunk instead. A full
block is therefore sealed, published (``KvStored``) and shareable by a later admission from the
moment its step is scheduled; an engine that keeps real KV tensors fills them in when the step
completes (``torch_engine/kv_store.py``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from services.kvcore.block_manager import BlockManager
from services.kvcore.request import CoreRequest
from services.kvcore.timing import PrefillChunk, StepTiming


@dataclass
class ScheduledItem:
    """One request's share of a step."""

    request: CoreRequest
    start: int                   # tokens whose KV the request held before this step
    tokens: list[int]            # tokens fed to the model this step (``all_tokens[start:]``)
    samples: bool                # the chunk reaches the last known token: the step generates one
    token: int | None            # the generated token, when known in advance (lookahead)

    @property
    def prefill_tokens(self) -> int:
        """Tokens computed this step (0 for a decode whose token was known in advance)."""
        return len(self.tokens)


@dataclass
class StepPlan:
    """What one engine step computes."""

    items: list[ScheduledItem] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)
    decode_batch: int = 0
    active_blocks: int = 0       # blocks referenced once the step is scheduled
    preempted: list[CoreRequest] = field(default_factory=list)
    finished: list[CoreRequest] = field(default_factory=list)  # ended while scheduling (no room)

    def modelled_seconds(self, timing: StepTiming) -> float:
        """The step's duration under a step-time model (the mocker's clock, the simulator's)."""
        return timing.step_seconds(self.prefills, self.decode_batch, self.active_blocks)


class Scheduler:
    """Waiting and running queues over a :class:`BlockManager` (see module docstring)."""

    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[CoreRequest] = deque()
        self.running: list[CoreRequest] = []
        self.preemptions = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: CoreRequest) -> None:
        self.waiting.append(request)

    def remove(self, request: CoreRequest) -> None:
        """Forget ``request`` (finished or aborted) and free its blocks. Idempotent."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.blocks.free(request.seq)
        request.lose_blocks()

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
                req.lose_blocks()
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
                item = self._try_admit(req, budget)
                if item is None:
                    if not self.running:  # cannot fit even into an empty cache (grew past capacity)
                        self.waiting.popleft()
                        req.finish("length")
                        plan.finished.append(req)
                        continue
                    break
                self.waiting.popleft()
                req.mark_admitted(item.start)
                self.running.append(req)
                plan.items.append(item)
                budget -= max(item.prefill_tokens, 1)
        for item in plan.items:
            req = item.request
            if item.prefill_tokens:
                plan.prefills.append(PrefillChunk(item.prefill_tokens, req.computed))
            else:
                plan.decode_batch += 1
        plan.active_blocks = self.blocks.active_blocks
        return plan

    def _try_schedule(self, req: CoreRequest, budget: int) -> ScheduledItem | None:
        """Take blocks for ``req``'s share of the step; None (nothing taken) if they are not there."""
        start = len(req.seq.tokens)
        if start == len(req.all_tokens):  # decoding: nothing to feed; hold the known next token (the hot path)
            token = req.lookahead()
            if token is not None and token not in req.stop_ids and not self.blocks.append(req.seq, (token,)):
                return None
            return ScheduledItem(req, start, [], True, token)
        item, held = self._share(req, start, budget)
        if not self.blocks.append(req.seq, held):
            return None
        return item

    def _share(self, req: CoreRequest, start: int, budget: int) -> tuple[ScheduledItem, list[int]]:
        """``req``'s share of the step from ``start`` on, and the tokens whose KV it holds (fed + known next)."""
        chunk = max(0, min(len(req.all_tokens) - start, budget))
        fed = req.all_tokens[start : start + chunk]
        samples = start + chunk == len(req.all_tokens)
        token = req.lookahead() if samples else None
        held = fed if token is None or token in req.stop_ids else [*fed, token]
        return ScheduledItem(req, start, fed, samples, token), held

    def _try_admit(self, req: CoreRequest, budget: int) -> ScheduledItem | None:
        """Admit the waiting ``req``: its cached prefix plus its first share of the step; None if they do not fit.

        The fit is decided before anything is taken (:meth:`BlockManager.probe_prefix`): a request at the
        head of the queue is tried every step while it waits, and taking and freeing its whole prefix each
        time cost O(prompt) per step. A refused try leaves the cache exactly as taking and freeing would.
        """
        blocks = self.blocks
        matched, idle = blocks.probe_prefix(req.seq, req.all_tokens)
        _, held = self._share(req, matched * blocks.block_size, budget)
        if -(-len(held) // blocks.block_size) > blocks.available_blocks - idle:
            blocks.touch_prefix(req.seq, matched)
            return None
        blocks.acquire_prefix(req.seq, req.all_tokens)
        item = self._try_schedule(req, budget)
        assert item is not None, "the probe said it fits"
        return item

    def _preempt(self, req: CoreRequest) -> None:
        self.running.remove(req)
        self.blocks.free(req.seq)
        req.lose_blocks()
        self.waiting.appendleft(req)
        self.preemptions += 1
