"""The torch engine: a real Hugging Face causal LM on the CPU behind the :class:`Engine` contract.

Scheduling is the shared engine core's (``services/kvcore``: continuous batching, chunked prefill,
FIFO admission with the longest cached prefix, preemption of the newest request under KV pressure).
This engine supplies only the compute of a planned step (:class:`TorchCompute`):

1. On the loop, each item gets its request's ``DynamicCache`` (a request just admitted builds one from
   its cached prefix blocks, ``kv_store.py``) and the list of blocks the step seals.
2. In a worker thread (the event loop stays free for gRPC and NATS), one forward per item, in plan
   order (continuous batching of whole requests; the forwards of one step are not fused into one
   padded batch); the KV of each block the step sealed is cut out of the cache. A request admitted
   in the same step may reuse a block sealed by an earlier item: it is taken from those fresh cuts.
3. Back on the loop, the fresh blocks go into the prefix cache and a token is sampled for every item
   whose chunk completed its known tokens; the core delivers them (stop rules, output batching).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from services.common.errors import InvalidRequestError
from services.common.model_dir import ModelDir
from services.kvcore.config import BatchingConfig
from services.kvcore.outputs import CheckedRequest
from services.kvcore.request import CoreRequest
from services.kvcore.scheduler import ScheduledItem, StepPlan
from services.worker.core_engine import CoreEngine
from services.worker.torch_engine.kv_store import PagedKvCache
from services.worker.torch_engine.runner import BlockKV, ModelRunner
from services.worker.torch_engine.sampler import Sampler


@dataclass(frozen=True)
class TorchConfig(BatchingConfig):
    """Knobs of the torch engine (capacity in blocks of ``block_size`` tokens, batching limits)."""


@dataclass(eq=False)
class _Work:
    item: ScheduledItem
    cache: Any                                                  # the request's DynamicCache; None: build it
    prefix: list[tuple[int, BlockKV | None]] = field(default_factory=list)  # cached blocks to build it from
    sealed: list[tuple[int, int]] = field(default_factory=list)  # (block index, hash) this step computes


class TorchCompute:
    """One step's forwards and sampling (see module docstring); the core does the rest."""

    def __init__(self, runner: ModelRunner, sampler: Sampler, kv: PagedKvCache, block_size: int) -> None:
        self.runner = runner
        self.sampler = sampler
        self.kv = kv
        self.block_size = block_size

    def modelled_seconds(self, plan: StepPlan) -> float:
        return 0.0  # a step takes as long as its forwards

    async def run(self, plan: StepPlan) -> Sequence[int | None]:
        work = [self._work(item) for item in plan.items]
        results, fresh = await asyncio.to_thread(self._forward, work)
        for block_hash, kv in fresh.items():
            self.kv.store(block_hash, kv)
        sampled: list[int | None] = []
        for w, (cache, logits) in zip(work, results, strict=True):
            req = w.item.request
            if req.finished:  # aborted while the step ran
                sampled.append(None)
                continue
            req.engine_state = cache
            sampled.append(self.sampler.sample(req.request, logits) if w.item.samples else None)
        return sampled

    def _work(self, item: ScheduledItem) -> _Work:
        req, bs = item.request, self.block_size
        w = _Work(item, req.engine_state)
        if w.cache is None:  # just admitted: its KV so far is the cached prefix (whole blocks)
            w.prefix = [(h, self.kv.get(h)) for h in req.seq.hashes[: item.start // bs]]
        for index in range(item.start // bs, (item.start + len(item.tokens)) // bs):
            if self.kv.awaiting(req.seq.hashes[index]):
                w.sealed.append((index, req.seq.hashes[index]))
        return w

    def _forward(self, work: list[_Work]) -> tuple[list[tuple[Any, torch.Tensor]], dict[int, BlockKV]]:
        """Runs in a worker thread: touches only the items' own caches, the model and the fresh cuts."""
        fresh: dict[int, BlockKV] = {}
        out = []
        for w in work:
            cache = w.cache
            if cache is None:
                cache = self.runner.assemble([kv if kv is not None else fresh[h] for h, kv in w.prefix])
            logits = self.runner.forward(w.item.tokens, cache, w.item.start)
            for index, block_hash in w.sealed:
                if block_hash not in fresh:
                    fresh[block_hash] = ModelRunner.cut_block(cache, index, self.block_size)
            out.append((cache, logits))
        return out, fresh


class TorchEngine(CoreEngine):
    """Implements :class:`services.worker.engine.Engine` with a real model (see module docstring)."""

    name = "torch"

    def __init__(
        self, config: TorchConfig, model: ModelDir, runner: ModelRunner, sampler: Sampler | None = None
    ) -> None:
        self.runner = runner
        self.sampler = sampler if sampler is not None else Sampler()
        self.kv = PagedKvCache()
        super().__init__(config, model, TorchCompute(runner, self.sampler, self.kv, config.block_size),
                         on_event=self.kv.on_event, on_release=lambda req: self.sampler.release(req.request_id))

    def _new_request(self, checked: CheckedRequest) -> CoreRequest:
        if any(t < 0 or t >= self.runner.vocab_size for t in checked.request.token_ids):
            raise InvalidRequestError(f"token ids must be in 0..{self.runner.vocab_size - 1}", param="token_ids")
        return CoreRequest(checked, tokenizer=self.model.tokenizer)

    def cached_block_hashes(self) -> set[int]:
        """Hashes of every full block whose KV this engine holds (what its KV events describe)."""
        return self.kv.hashes()
