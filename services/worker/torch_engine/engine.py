"""The torch engine: a real Hugging Face causal LM (CPU or GPU) behind the :class:`Engine` contract.

Scheduling is the shared engine core's (``services/kvcore``: continuous batching, chunked prefill,
FIFO admission with the longest cached prefix, preemption of the newest request under KV pressure).
This engine supplies only the compute of a planned step (:class:`TorchCompute`):

1. On the loop, each item's block table comes from the core's block manager (its block ids are the slots of
   the paged KV pool, ``kv_pool.py``): the blocks of a cached prefix are used where they lie, nothing is copied.
2. In a worker thread (the event loop stays free for gRPC and NATS), one forward of the whole step: every
   item's tokens packed into one sequence (prefill chunks and decodes, each with its own positions), attention
   over the pool through transformers' attention registry.
3. Back on the loop, a token is sampled for every item whose chunk completed its known tokens (per request,
   seeded); the core delivers them (stop rules, output batching).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from services.common.errors import InvalidRequestError
from services.common.model_dir import ModelDir
from services.kvcore.block_manager import BlockManager
from services.kvcore.config import BatchingConfig
from services.kvcore.outputs import CheckedRequest
from services.kvcore.request import CoreRequest
from services.kvcore.scheduler import StepPlan
from services.worker.core_engine import CoreEngine
from services.worker.torch_engine.kv_pool import CachedHashes, KvPool, StepBatch, plan_batch
from services.worker.torch_engine.runner import ModelRunner
from services.worker.torch_engine.sampler import Sampler


@dataclass(frozen=True)
class TorchConfig(BatchingConfig):
    """Knobs of the torch engine (capacity in blocks of ``block_size`` tokens, batching limits)."""


@dataclass(eq=False)
class _Table:
    """A running request's block ids of its full blocks so far (a held full block keeps its id)."""

    full: list[int] = field(default_factory=list)


class TorchCompute:
    """One step's forward and sampling (see module docstring); the core does the rest."""

    def __init__(self, runner: ModelRunner, sampler: Sampler, pool: KvPool) -> None:
        self.runner = runner
        self.sampler = sampler
        self.pool = pool
        self.blocks: BlockManager | None = None  # the core's (made with the core, after this compute)

    def modelled_seconds(self, plan: StepPlan) -> float:
        return 0.0  # a step takes as long as its forward

    def _table(self, req: CoreRequest) -> list[int]:
        assert self.blocks is not None
        state = req.engine_state
        seq = req.seq
        if not isinstance(state, _Table) or len(state.full) > len(seq.hashes):
            state = req.engine_state = _Table()
        fresh = self.blocks.block_ids(seq, len(state.full))
        new_full = len(seq.hashes) - len(state.full)
        state.full.extend(fresh[:new_full])
        return state.full + fresh[new_full:]

    async def run(self, plan: StepPlan) -> Sequence[int | None]:
        tokens: list[int] = []
        positions: list[int] = []
        items: list[tuple[int, int, list[int]]] = []
        keep: list[int] = []
        for item in plan.items:
            n = len(item.tokens)
            tokens.extend(item.tokens)
            positions.extend(range(item.start, item.start + n))
            items.append((item.start, n, self._table(item.request)))
            if item.samples:
                keep.append(len(tokens) - 1)
        logits = await asyncio.to_thread(self._forward, tokens, positions, items, keep) if tokens else None
        sampled: list[int | None] = []
        row = 0
        for item in plan.items:
            if not item.samples:
                sampled.append(None)
                continue
            assert logits is not None
            req = item.request
            sampled.append(None if req.finished else self.sampler.sample(req.request, logits[row]))
            row += 1
        return sampled

    def _forward(self, tokens: list[int], positions: list[int], items: list[tuple[int, int, list[int]]],
                 keep: list[int]) -> torch.Tensor:
        """Runs in a worker thread: writes only the step's own slots of the pool."""
        batch: StepBatch = plan_batch(self.pool, items)
        return self.runner.forward(tokens, positions, batch, keep)


class TorchEngine(CoreEngine):
    """Implements :class:`services.worker.engine.Engine` with a real model (see module docstring)."""

    name = "torch"

    def __init__(
        self, config: TorchConfig, model: ModelDir, runner: ModelRunner, sampler: Sampler | None = None
    ) -> None:
        self.runner = runner
        self.sampler = sampler if sampler is not None else Sampler()
        self.cached = CachedHashes()
        self.pool = runner.new_pool(config.num_blocks, config.block_size)
        self.compute = compute = TorchCompute(runner, self.sampler, self.pool)
        super().__init__(config, model, compute, on_event=self.cached.on_event,
                         on_release=lambda req: self.sampler.release(req.request_id))
        compute.blocks = self.blocks

    def _new_request(self, checked: CheckedRequest) -> CoreRequest:
        if any(t < 0 or t >= self.runner.vocab_size for t in checked.request.token_ids):
            raise InvalidRequestError(f"token ids must be in 0..{self.runner.vocab_size - 1}", param="token_ids")
        return CoreRequest(checked, tokenizer=self.model.tokenizer)

    def cached_block_hashes(self) -> set[int]:
        """Hashes of every full block whose KV this engine holds (what its KV events describe)."""
        return self.cached.hashes()
