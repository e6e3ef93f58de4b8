"""The torch engine: a real Hugging Face causal LM on the CPU behind the :class:`Engine` contract.

One asyncio task runs the step loop:

1. *Admit* waiting requests FIFO (up to ``max_num_seqs``): each references the longest cached
   full-block prefix of its tokens (``kv_store.py``), so only the uncached suffix is prefilled.
2. *Plan* one step: every running request gets its next chunk (the rest of its prompt within the
   step's ``max_num_batched_tokens`` budget — chunked prefill — or the one token it sampled last).
   Blocks for the whole step are checked up front; when they run out the most recently admitted
   request is preempted (its blocks freed, recomputed later, mostly from the prefix cache), and a
   request alone that still cannot grow finishes with ``length``.
3. *Compute* the step's forwards in a worker thread (the event loop stays free for gRPC and NATS);
   requests are interleaved step by step, each in its own forward (continuous batching of whole
   requests; the forwards of one step are not fused into one padded batch).
4. *Apply* on the loop: commit each chunk's KV to the block manager (full blocks are copied into the
   prefix cache and published as ``KvStored``), sample the next token where the prompt is complete,
   and hand it to the request's :class:`RequestStream` (stop rules, output batching).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import structlog
import torch

from services.common.errors import InternalError, InvalidRequestError, as_mesh_error
from services.common.model_dir import ModelDir
from services.worker.engine import (
    BatchingConfig,
    EngineInfo,
    EngineOutput,
    EngineRequest,
    EngineStats,
    FinishReason,
    KvEvent,
)
from services.worker.kv_feed import KvEventFeed
from services.worker.mocker.block_manager import KvSequence
from services.worker.outputs import RequestStream, check_request
from services.worker.torch_engine.kv_store import PagedKvCache
from services.worker.torch_engine.runner import BlockKV, ModelRunner
from services.worker.torch_engine.sampler import Sampler

log = structlog.get_logger()
_order = itertools.count()


@dataclass(frozen=True)
class TorchConfig(BatchingConfig):
    """Knobs of the torch engine (capacity in blocks of ``block_size`` tokens, batching limits)."""


@dataclass(eq=False)
class _Request:
    stream: RequestStream
    seq: KvSequence
    tokens: list[int]                          # prompt + sampled tokens (the last one is fed next step)
    cache: Any = None                          # the request's DynamicCache while it runs
    prefix: list[BlockKV] = field(default_factory=list)  # cached blocks to build ``cache`` from
    cached_tokens: int | None = None
    order: int = 0
    released: bool = False


@dataclass(eq=False)
class _Item:
    req: _Request
    start: int
    tokens: list[int]
    cache: Any
    prefix: list[BlockKV]


class TorchEngine:
    """Implements :class:`services.worker.engine.Engine` with a real model (see module docstring)."""

    name = "torch"

    def __init__(
        self, config: TorchConfig, model: ModelDir, runner: ModelRunner, sampler: Sampler | None = None
    ) -> None:
        self.config = config
        self.model = model
        self.runner = runner
        self.sampler = sampler if sampler is not None else Sampler()
        self._feed = KvEventFeed()
        self.kv = PagedKvCache(config.num_blocks, config.block_size, self._feed.emit)
        self._requests: dict[str, _Request] = {}
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.steps = 0
        self.preemptions = 0
        self._preempted_last_step = False

    # -- Engine contract ------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="torch-step-loop")

    async def close(self) -> None:
        self._closed = True
        for req in list(self._requests.values()):
            self._release(req)
            req.stream.finish("cancelled")
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
            req.stream.finish("cancelled")
            self._wakeup.set()

    def kv_events(self) -> AsyncIterator[list[KvEvent]]:
        return self._feed.subscribe()

    def info(self) -> EngineInfo:
        return EngineInfo(self.name, self.model.name, self.config.block_size, self.config.num_blocks,
                          self.model.max_model_len)

    def stats(self) -> EngineStats:
        blocks = self.kv.blocks
        return EngineStats(
            active_requests=len(self._running) + len(self._waiting),
            running_requests=len(self._running),
            waiting_requests=len(self._waiting),
            active_blocks=blocks.active_blocks,
            cached_blocks=blocks.cached_blocks,
            total_blocks=blocks.total_blocks,
            block_size=blocks.block_size,
            steps=self.steps,
            preemptions=self.preemptions,
        )

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        if self._closed or self._task is None:
            raise InternalError("the engine is not running")
        checked = check_request(request, self.model, capacity_tokens=self.config.num_blocks * self.config.block_size,
                                max_tokens_default=self.config.max_tokens_default)
        request = checked.request
        if request.request_id in self._requests:
            raise InvalidRequestError(f"request id {request.request_id!r} is already running", param="request_id")
        if any(t < 0 or t >= self.runner.vocab_size for t in request.token_ids):
            raise InvalidRequestError(f"token ids must be in 0..{self.runner.vocab_size - 1}", param="token_ids")
        req = _Request(RequestStream(checked, self.model.tokenizer), KvSequence(request.cache_salt),
                       list(request.token_ids))
        self._requests[request.request_id] = req
        self._waiting.append(req)
        self._wakeup.set()
        try:
            async for out in req.stream.outputs():
                yield out
        finally:
            self._release(req)

    def clear_kv_cache(self) -> bool:
        """Drop every cached (unreferenced) block; refused while requests hold blocks."""
        return self.kv.clear()

    def cached_block_hashes(self) -> set[int]:
        """Hashes of every full block whose KV this engine holds (what its KV events describe)."""
        return self.kv.hashes()

    # -- the step loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while not self._closed:
                if not self._waiting and not self._running:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                if not self._preempted_last_step:  # let a preempted request's room go to the others first
                    self._admit()
                items, changed = self._plan()
                self._preempted_last_step = changed and bool(items)
                if not items:
                    if not changed:
                        self._wakeup.clear()
                        await self._wakeup.wait()
                    await asyncio.sleep(0)
                    continue
                results = await asyncio.to_thread(self._compute, items)
                self.steps += 1
                self._apply(items, results)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: fail every request rather than hang them
            log.exception("worker.engine_failed", engine=self.name)
            err = as_mesh_error(exc)
            for req in list(self._requests.values()):
                self._release(req)
                req.stream.fail(err)

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.config.max_num_seqs:
            req = self._waiting[0]
            prefix = self.kv.acquire_prefix(req.seq, req.tokens)
            if not self.kv.can_hold(req.seq, len(req.tokens) - len(req.seq.tokens)):
                self.kv.free(req.seq)
                if not self._running:  # grew past the whole cache while preempted
                    self._waiting.popleft()
                    self._finish(req, "length")
                    continue
                return
            self._waiting.popleft()
            if req.cached_tokens is None:
                req.cached_tokens = len(req.seq.tokens)
            req.prefix, req.cache, req.order = prefix, None, next(_order)
            self._running.append(req)

    def _plan(self) -> tuple[list[_Item], bool]:
        items: list[_Item] = []
        budget = self.config.max_num_batched_tokens
        reserved = 0
        changed = False
        for req in list(self._running):
            if req not in self._running or budget <= 0:
                continue
            start = len(req.seq.tokens)
            chunk = req.tokens[start : start + budget]
            while not self.kv.can_hold(req.seq, len(chunk), reserved):
                changed = True
                victim = max(self._running, key=lambda r: r.order)
                if victim is req and len(self._running) == 1:
                    self._finish(req, "length")  # alone and still out of KV capacity
                    break
                planned = next((it for it in items if it.req is victim), None)
                if planned is not None:
                    items.remove(planned)
                    reserved -= self.kv.blocks.blocks_needed(victim.seq, len(planned.tokens))
                    budget += len(planned.tokens)
                self._preempt(victim)
                if victim is req:
                    break
            else:
                reserved += self.kv.blocks.blocks_needed(req.seq, len(chunk))
                budget -= len(chunk)
                items.append(_Item(req, start, chunk, req.cache, req.prefix))
        return items, changed

    def _compute(self, items: list[_Item]) -> list[tuple[Any, torch.Tensor]]:
        """Runs in a worker thread: touches only the items' own caches and the model."""
        out = []
        for item in items:
            cache = item.cache if item.cache is not None else self.runner.assemble(item.prefix)
            out.append((cache, self.runner.forward(item.tokens, cache, item.start)))
        return out

    def _apply(self, items: list[_Item], results: list[tuple[Any, torch.Tensor]]) -> None:
        for item, (cache, logits) in zip(items, results, strict=True):
            req = item.req
            if req.released or req not in self._running or len(req.seq.tokens) != item.start:
                continue  # aborted or preempted while the step ran
            req.cache, req.prefix = cache, []
            if not self.kv.commit(req.seq, item.tokens, cache):
                raise InternalError("KV blocks planned for a step were not available")
            if len(req.seq.tokens) < len(req.tokens):
                continue  # more prompt to prefill
            req.stream.prompt_done(req.cached_tokens or 0)
            token = self.sampler.sample(req.stream.request, logits)
            if req.stream.deliver(token):
                self._release(req)
            else:
                req.tokens.append(token)

    # -- bookkeeping ----------------------------------------------------------------------------

    def _preempt(self, req: _Request) -> None:
        self._running.remove(req)
        self.kv.free(req.seq)
        req.cache, req.prefix = None, []
        self._waiting.appendleft(req)
        self.preemptions += 1

    def _finish(self, req: _Request, reason: FinishReason) -> None:
        self._release(req)
        req.stream.finish(reason)

    def _release(self, req: _Request) -> None:
        if req.released:
            return
        req.released = True
        if self._requests.get(req.stream.request_id) is req:
            del self._requests[req.stream.request_id]
        if req in self._running:
            self._running.remove(req)
        elif req in self._waiting:
            self._waiting.remove(req)
        self.kv.free(req.seq)
        self.sampler.release(req.stream.request_id)
        req.cache, req.prefix = None, []
