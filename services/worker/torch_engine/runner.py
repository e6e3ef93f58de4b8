"""A Hugging Face causal LM on the CPU or a GPU, run one packed batch per engine step over the paged KV pool.

Imports torch and transformers (the ``torch`` extra); only ``services.worker.torch_engine`` imports this.
The model is loaded with :func:`~services.worker.torch_engine.kv_pool.paged_attention` as its attention
implementation (transformers' ``AttentionInterface`` registry): its KV lives in the :class:`KvPool`
(``kv_pool.py``), never in a per-request cache.

``device`` (``--device``): the weights and the pool live there; only the sampled items' last logits come back
to the CPU, where the sampler (and its per-request seeded generators) runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from services.common.errors import InvalidRequestError
from services.worker.torch_engine.kv_pool import KvPool, StepBatch, register_attention, step_context

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner:
    """Loads ``path`` with ``AutoModelForCausalLM`` (any HF causal LM whose attention uses transformers'
    registry) and runs it without gradients on ``device``."""

    def __init__(self, path: str | Path, dtype: str = "float32", threads: int = 0, device: str = "cpu") -> None:
        if threads > 0:
            torch.set_num_threads(threads)
        if dtype not in DTYPES:
            raise InvalidRequestError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise InvalidRequestError(f"--device {device}: PyTorch sees no CUDA GPU here (torch {torch.__version__})")
        self.device = torch.device(device)
        self.dtype = DTYPES[dtype]
        try:
            model: Any = AutoModelForCausalLM.from_pretrained(
                str(path), dtype=self.dtype, attn_implementation=register_attention())
        except (OSError, ValueError, KeyError) as exc:
            raise InvalidRequestError(
                f"cannot load a causal LM from {str(path)!r} (config.json + weights, Hugging Face layout): {exc}"
            ) from exc
        if getattr(model.config, "attn_logit_softcapping", None) or any(hasattr(m, "sinks") for m in model.modules()):
            raise InvalidRequestError(f"{str(path)!r}: soft-capped attention logits (Gemma 2) and attention sinks "
                                      "(gpt-oss) are not supported by the torch engine's paged attention")
        self.model: Any = model.to(self.device)
        self.model.requires_grad_(False)
        self.model.train(False)
        self.config: Any = self.model.config
        self.vocab_size = int(self.config.vocab_size)

    def new_pool(self, num_blocks: int, block_size: int) -> KvPool:
        """The paged KV of ``num_blocks`` blocks, preallocated on the runner's device in its dtype."""
        return KvPool(self.config, num_blocks, block_size, self.dtype, self.device)

    @torch.inference_mode()
    def forward(self, token_ids: Sequence[int], positions: Sequence[int], batch: StepBatch,
                keep: Sequence[int]) -> torch.Tensor:
        """One forward of a packed step (``batch``); the logits at packed indices ``keep``, ``[len(keep), vocab]``
        as float32 on the CPU."""
        if not keep:
            keep = [len(token_ids) - 1]  # computed anyway; nothing is sampled from it
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        pos = torch.tensor([list(positions)], dtype=torch.long, device=self.device)
        rows = torch.tensor(list(keep), dtype=torch.long, device=self.device)
        with step_context(batch):
            out = self.model(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=rows)
        logits: torch.Tensor = out.logits[0].float().cpu()
        return logits
