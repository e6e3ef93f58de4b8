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

Prefill order (``prefill_order``): with ``fcfs`` the running prefills take the step's budget in admission
order and the waiting queue gets what is left, so a short prompt (an agent's next turn: its cached
conversation plus a tool result) waits behind a long one's every chunk. ``shortest`` (the default) gives the
budget left after the decodes to prefills by fewest tokens still to compute first, the waiting head among
them (its cached prefix probed): a 2,000-token turn behind a cold 100,000-token prompt gets its first token
in one step instead of twelve, and the long prompt loses one step. Shortest-remaining-first minimises mean
waiting (as SGLang's cache-aware ``lpm`` policy and vLLM's concurrent partial prefills aim to); the
router counts a worker's prefills in flight the same way (``services/router/policy.py``). Only how much
each request computes changes: blocks are still taken, and preemption still chosen, in admission order.

Blocks for a step's tokens are taken when it is scheduled, so a step never runs out of room
half-way: the chunk fed to the model, plus, when the request knows its next token in advance
(:meth:`CoreRequest.lookahead`: scripted or seeded output, the mocker and the simulator), that
token too, so the KV it adds is held before the step's time passes. A request without lookahead
(the torch engine samples) feeds its sampled token as next step's one-token chunk instead. A full
block is therefore sealed, published (``KvStored``) and shareable by a later admission from the
moment its step is scheduled; an engine that keeps real KV tensors fills them in when the step
runs (the torch engine's forward writes them into its paged pool, ``torch_engine/kv_pool.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from services.kvcore.block_manager import BlockManager
from services.kvcore.config import PREFILL_ORDERS
from services.kvcore.request import CoreRequest, TokenStream
from services.kvcore.timing import PrefillChunk, StepTiming


@dataclass
class ScheduledItem:
    """One request's share of a step."""

    request: CoreRequest
    start: int                   # tokens whose KV the request held before this step
    tokens: Sequence[int]        # tokens fed to the model this step (``all_tokens[start:]``; a list, or in
                                 # the simulator a lazy ``TokenWindow``)
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

    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 retention: bool = True, prefill_order: str = "shortest") -> None:
        if prefill_order not in PREFILL_ORDERS:
            raise ValueError(f"unknown prefill order {prefill_order!r}; valid: {', '.join(PREFILL_ORDERS)}")
        self.blocks = blocks
        self.shortest_first = prefill_order == "shortest"
        self.retention = retention  # honour requests' retention hints (off: plain LRU)
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
        hint = request.retention if self.retention else None
        if hint is not None and request.seq.hashes:
            generated = request.all_tokens[len(request.all_tokens) - request.generated :] if request.generated else ()
            hold_s, strong = hint.lease_for(generated)
            self.blocks.free(request.seq, hold_s, hint.first_for(generated), strong)
        else:
            self.blocks.free(request.seq)
        request.lose_blocks()

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self._schedule_running(plan, self._allotment() if self.shortest_first else None)
        if not plan.preempted:
            self._admit_waiting(plan, budget)
        return self._close(plan)

    def _allotment(self) -> dict[CoreRequest, int] | None:
        """Shortest-first: each running prefill's share of the step's budget (None: the plain order gives the
        same shares, so it runs as ``fcfs``)."""
        running = self.running
        prefills = [req for req in running if req.prefilling]
        waiting = self.waiting[0] if self.waiting and len(running) < self.max_num_seqs else None
        if not prefills or (len(prefills) == 1 and waiting is None):
            return None
        budget = self.max_num_batched_tokens - (len(running) - len(prefills))
        remaining: list[tuple[int, float, CoreRequest]] = [
            (len(req.all_tokens) - req.seq.length, req.order, req) for req in prefills]
        if waiting is not None:
            matched, _ = self.blocks.probe_prefix(waiting.seq, waiting.all_tokens)
            remaining.append((len(waiting.all_tokens) - matched * self.blocks.block_size, _WAITING, waiting))
        shares: dict[CoreRequest, int] = {}
        for left, _, req in sorted(remaining, key=_by_remaining):
            shares[req] = share = max(0, min(left, budget))
            budget -= share
        return shares

    def _schedule_running(self, plan: StepPlan, shares: dict[CoreRequest, int] | None = None) -> int:
        """Running requests' shares of the step (preempting the newest where blocks run out); the budget left.
        ``shares``: the most each prefill computes (shortest-first); the budget left then includes what the
        waiting head was given."""
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running):
            req = self.running[i]
            cap = budget if shares is None or not req.prefilling else min(budget, shares.get(req, 0))
            if cap <= 0 and req.prefilling:
                i += 1
                continue
            item = self._try_schedule(req, cap)
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
        return budget

    def _admit_waiting(self, plan: StepPlan, budget: int) -> None:
        """Admit waiting requests FIFO into ``plan`` while seats, ``budget`` and blocks allow."""
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

    def _close(self, plan: StepPlan) -> StepPlan:
        """``plan``'s step-time inputs: its prefill chunks, decode batch and blocks in use."""
        for item in plan.items:
            req = item.request
            if item.prefill_tokens:
                plan.prefills.append(PrefillChunk(item.prefill_tokens, req.computed))
            else:
                plan.decode_batch += 1
        plan.active_blocks = self.blocks.active_blocks
        return plan

    def plain_step(self) -> StepPlan | None:
        """Schedule the next step, and complete it at once, when it only decodes; None (nothing done) if not.

        A plain step decodes one known token per running request that neither stops nor ends it, and the
        blocks those tokens need are there (no preemption). Its tokens' KV is held (blocks taken, sealed,
        events emitted) and a waiting request tried exactly as :meth:`schedule` would. When that request
        is refused, the tokens are delivered now and the plan returned has no items (only its step-time
        inputs); when it fits, the step admits it and the plan returned is :meth:`schedule`'s, to complete.
        """
        running = self.running
        if not running or not all(map(_decodes_plainly, running)):
            return None
        blocks = self.blocks
        if sum(req.seq.partial is None for req in running) > blocks.available_blocks:
            return None
        tokens: list[int] = []
        for req in running:
            token = req.lookahead()
            assert token is not None, "checked: known in advance"
            held = blocks.append(req.seq, (token,))
            assert held, "checked: the blocks are there"
            tokens.append(token)
        budget = self.max_num_batched_tokens - len(running)
        if self.waiting and len(running) < self.max_num_seqs and budget > 0 \
                and not self._refuse(self.waiting[0], budget):
            return self._plain_admits(tokens, budget)
        for req, token in zip(running, tokens, strict=True):
            req.deliver(token)
        return StepPlan(decode_batch=len(running), active_blocks=blocks.active_blocks)

    def _plain_admits(self, tokens: list[int], budget: int) -> StepPlan:
        """A plain step whose waiting request fits after all: the rest of :meth:`schedule`, tokens undelivered."""
        plan = StepPlan(items=[ScheduledItem(req, req.computed - 1, [], True, token)
                               for req, token in zip(self.running, tokens, strict=True)])
        self._admit_waiting(plan, budget)
        return self._close(plan)

    def quiet_steps(self) -> int:
        """How many next steps are *quiet*, 0 when the next one is not.

        A quiet step decodes one known token per running request into room its partial block has, and
        finishes, preempts and admits nothing: it takes no block, emits no event, produces no first token,
        and is planned exactly like the one before. A waiting request is tried now, as the first such
        step would try it (refused, its prefix counts as just used); with no block taken or freed
        until the stretch ends, the later steps' tries change nothing. A positive answer therefore
        commits the caller to :meth:`advance_quiet` by at least one step before anything else changes.
        """
        running = self.running
        if not running:
            return 0
        bs = self.blocks.block_size
        steps = bs
        for req in running:
            steps = min(steps, _quiet_room(req, bs))
            if steps <= 0:
                return 0
        budget = self.max_num_batched_tokens - len(running)
        if self.waiting and len(running) < self.max_num_seqs and budget > 0 \
                and not self._refuse(self.waiting[0], budget):
            return 0
        return steps

    def advance_quiet(self, steps: int) -> None:
        """Take ``steps`` quiet steps at once (at most :meth:`quiet_steps`): the state that many planned and
        completed steps leave, in one pass per request (requests are independent while no block is taken)."""
        for req in self.running:
            tokens = req.take_known(steps)
            self.blocks.extend_partial(req.seq, tokens)
            req.deliver_quiet(tokens)

    def decode_stretch(self, step_ms: Callable[[int], float], start: float, horizon: float,
                       events_ready: Callable[[], None], *, first: bool) -> tuple[int, float, StepPlan | None]:
        """Take the next steps that :meth:`quiet_steps` / :meth:`plain_step` would take one run or one step at a
        time, in one pass: (steps taken, the last one's end, None), or, when a step admits the waiting request
        after all, ``(steps before it, their end, that step's plan)``, a plan to complete as :meth:`plain_step`'s.
        A simulated clock only (no compute runs between the steps).

        Steps start at ``start`` (ms) and follow each other; each lasts ``step_ms(active blocks once its blocks
        are taken)`` (asked again after each step that takes blocks: the caller memoises it), summed step by
        step. The first is taken even at or past ``horizon`` when ``first``; every other only while the clock is
        before ``horizon``. Each step decodes one known token per running request
        (none stops or ends it: see :meth:`plain_step`). A step in which no token fills or opens a block is a
        quiet one; in one that does, those requests hold their tokens in running order and the waiting request
        is tried, exactly as :meth:`plain_step` does (blocks taken or evicted, sealed, events emitted), and
        ``events_ready`` is called before the next step begins: the events so far may then reach a router (the
        one-by-one loop sends them there), the caller may send them in one go. The other requests'
        tokens are held and delivered at their next block boundary or at the end, all at once: in between
        they touch no shared state and nothing reads them.

        The stretch stops before a step that would end a request or lacks the blocks it opens (a preemption):
        :meth:`plan_step` takes those.
        """
        running = self.running
        if not running or not all(map(_decodes_plainly, running)):
            return 0, start, None
        blocks = self.blocks
        bs = blocks.block_size
        budget = self.max_num_batched_tokens - len(running)
        tries = bool(self.waiting) and len(running) < self.max_num_seqs and budget > 0  # the waiting request
        crossing = [_next_crossing(req, 0, bs) for req in running]
        if tries and 1 not in crossing and not self._refuse(self.waiting[0], budget):
            return 0, start, None  # (a step that holds blocks tries it after taking them, below)
        most = min(req.max_tokens - 1 - req.generated for req in running)  # steps before one would end a request
        applied = [0] * len(running)  # tokens of the stretch each request holds (and was given) so far
        ms = step_ms(blocks.active_blocks)
        end, steps = start, 0
        held = False  # the last step held blocks: its events go out before the next step
        while steps < most and (end < horizon or (steps == 0 and first)):
            step = steps + 1
            nearest = min(crossing)
            if nearest > step:  # steps whose tokens all stay in their partial blocks
                if held:
                    events_ready()
                    held = False
                last = min(nearest - 1, most)
                end += ms
                steps = step
                while steps < last and end < horizon:
                    end += ms
                    steps += 1
                continue
            crossers = [running[i] for i, c in enumerate(crossing) if c == step]
            if sum(req.seq.partial is None for req in crossers) > blocks.available_blocks:
                break
            for i, c in enumerate(crossing):
                if c == step:
                    self._hand_over(running[i], step - 1 - applied[i])
                    applied[i] = step - 1
            if held:
                events_ready()
            for req in crossers:
                token = req.lookahead()
                assert token is not None, "checked: known in advance"
                blocks.append(req.seq, (token,))
            if tries and not self._refuse(self.waiting[0], budget):
                return steps, end, self._admitting_step(applied, crossing, step)
            for i, c in enumerate(crossing):
                if c == step:
                    req = running[i]
                    req.deliver_quiet(req.take_known(1))
                    applied[i] = step
                    crossing[i] = _next_crossing(req, step, bs)
            held = True
            ms = step_ms(blocks.active_blocks)
            end += ms
            steps = step
        for req, done in zip(running, applied, strict=True):
            self._hand_over(req, steps - done)
        return steps, end, None

    def _admitting_step(self, applied: list[int], crossing: list[int], step: int) -> StepPlan:
        """Step ``step`` of a decode stretch admits the waiting request: every running request then holds its tokens
        up to it (those that filled or opened a block hold this step's already); the plan is :meth:`plain_step`'s."""
        for req, done, c in zip(self.running, applied, crossing, strict=True):
            if c != step:
                self._hand_over(req, step - 1 - done)
                token = req.lookahead()
                assert token is not None, "checked: known in advance"
                self.blocks.extend_partial(req.seq, (token,))
        tokens = [req.lookahead() for req in self.running]
        return self._plain_admits(tokens, self.max_num_batched_tokens - len(self.running))  # type: ignore[arg-type]

    def _hand_over(self, req: CoreRequest, count: int) -> None:
        """``req``'s next ``count`` tokens: held in its partial block and delivered (they end nothing)."""
        if count > 0:
            tokens = req.take_known(count)
            self.blocks.extend_partial(req.seq, tokens)
            req.deliver_quiet(tokens)

    def _try_schedule(self, req: CoreRequest, budget: int) -> ScheduledItem | None:
        """Take blocks for ``req``'s share of the step; None (nothing taken) if they are not there."""
        start = req.seq.length
        if start == len(req.all_tokens):  # decoding: nothing to feed; hold the known next token (the hot path)
            token = req.lookahead()
            if token is not None and token not in req.stop_ids and not self.blocks.append(req.seq, (token,)):
                return None
            return ScheduledItem(req, start, [], True, token)
        item, held = self._share(req, start, budget)
        if not self.blocks.append(req.seq, held):
            return None
        return item

    def _share(self, req: CoreRequest, start: int, budget: int) -> tuple[ScheduledItem, Sequence[int]]:
        """``req``'s share of the step from ``start`` on, and the tokens whose KV it holds (fed + known next)."""
        stream = req.all_tokens
        chunk = max(0, min(len(stream) - start, budget))
        samples = start + chunk == len(stream)
        token = req.lookahead() if samples else None
        fed: Sequence[int]
        held: Sequence[int]
        if isinstance(stream, TokenStream):  # a shared prompt: the chunk is a view (the simulator reads its tail)
            fed = stream.window(start, start + chunk)
            held = fed if token is None or token in req.stop_ids else stream.window(start, start + chunk, token)
        else:
            fed = stream[start : start + chunk]
            held = fed if token is None or token in req.stop_ids else [*fed, token]
        return ScheduledItem(req, start, fed, samples, token), held

    def _try_admit(self, req: CoreRequest, budget: int) -> ScheduledItem | None:
        """Admit the waiting ``req``: its cached prefix plus its first share of the step; None if they do not fit.

        The fit is decided before anything is taken (:meth:`BlockManager.probe_prefix`): a request at the
        head of the queue is tried every step while it waits, and taking and freeing its whole prefix each
        time cost O(prompt) per step. A refused try leaves the cache exactly as taking and freeing would.
        """
        if self._refuse(req, budget):
            return None
        self.blocks.acquire_prefix(req.seq, req.all_tokens)
        item = self._try_schedule(req, budget)
        assert item is not None, "the probe said it fits"
        return item

    def _refuse(self, req: CoreRequest, budget: int) -> bool:
        """True when the waiting ``req`` does not fit now (its prefix then counts as just used); probes only."""
        blocks = self.blocks
        bs = blocks.block_size
        matched, idle = blocks.probe_prefix(req.seq, req.all_tokens)
        if -(-self._held_count(req, matched * bs, budget) // bs) <= blocks.available_blocks - idle:
            return False
        blocks.touch_prefix(req.seq, matched)
        return True

    def _held_count(self, req: CoreRequest, start: int, budget: int) -> int:
        """How many tokens :meth:`_share` would hold from ``start`` on (without slicing them out)."""
        total = len(req.all_tokens)
        chunk = max(0, min(total - start, budget))
        if start + chunk < total:
            return chunk
        token = req.lookahead()
        return chunk if token is None or token in req.stop_ids else chunk + 1

    def _preempt(self, req: CoreRequest) -> None:
        self.running.remove(req)
        self.blocks.free(req.seq)
        req.lose_blocks()
        self.waiting.appendleft(req)
        self.preemptions += 1


_WAITING = float("inf")  # the waiting head's place among running prefills with as many tokens left


def _by_remaining(entry: tuple[int, float, CoreRequest]) -> tuple[int, float]:
    return entry[0], entry[1]


def _decodes_plainly(req: CoreRequest) -> bool:
    """``req`` decodes a known token next that neither stops nor ends it (nor is its first)."""
    return (req.seq.length == len(req.all_tokens) and req.source is not None and not req.stop_ids
            and not req.matcher.active and not req.finished and 0 < req.generated < req.max_tokens - 1)


def _quiet_room(req: CoreRequest, block_size: int) -> int:
    """Quiet steps ``req`` allows: it decodes known tokens that neither stop nor end it, into its partial block.
    With stop ids (EOS, unless ``ignore_eos``), as many as come before the first stop id among its known tokens."""
    seq = req.seq
    held = seq.length
    if seq.partial is None or held != len(req.all_tokens) or req.source is None or req.matcher.active \
            or req.finished:
        return 0
    room = min(block_size - 1 - (held - len(seq.hashes) * block_size), req.max_tokens - req.generated - 1)
    if req.stop_ids and room > 0:
        stops = req.stop_ids
        room = next((i for i, token in enumerate(req.source.known(room)) if token in stops), room)
    return room


def _next_crossing(req: CoreRequest, step: int, block_size: int) -> int:
    """The first step after ``step`` (of a decode stretch; ``req`` holds its tokens up to there) whose token fills
    ``req``'s partial block or opens a new one."""
    seq = req.seq
    if seq.partial is None:
        return step + 1
    return step + block_size - (seq.length - len(seq.hashes) * block_size)
