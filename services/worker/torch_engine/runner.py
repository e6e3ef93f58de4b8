"""A Hugging Face causal LM on the CPU or a GPU: forwards over a KV cache, and that cache cut into / built from blocks.

Imports torch and transformers (the ``torch`` extra); only ``services.worker.torch_engine`` imports this.
A request's KV lives in a contiguous ``transformers.DynamicCache`` while it runs; full blocks are
copied out of it into the paged prefix cache (``kv_store.py``) and a later request's cached prefix
is rebuilt from those copies with :meth:`ModelRunner.assemble`.

``device`` (``--device``): the weights, the caches and the block copies live there; only each step's
last logits come back to the CPU, where the sampler (and its per-request seeded generators) runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from services.common.errors import InvalidRequestError

BlockKV = tuple[tuple[torch.Tensor, torch.Tensor], ...]
"""One block's keys and values, per layer: ``[kv_heads, block_size, head_dim]`` each."""

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner:
    """Loads ``path`` with ``AutoModelForCausalLM`` (any HF causal LM) and runs it without gradients on ``device``."""

    def __init__(self, path: str | Path, dtype: str = "float32", threads: int = 0, device: str = "cpu") -> None:
        if threads > 0:
            torch.set_num_threads(threads)
        if dtype not in DTYPES:
            raise InvalidRequestError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise InvalidRequestError(f"--device {device}: PyTorch sees no CUDA GPU here (torch {torch.__version__})")
        self.device = torch.device(device)
        try:
            model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype])
        except (OSError, ValueError, KeyError) as exc:
            raise InvalidRequestError(
                f"cannot load a causal LM from {str(path)!r} (config.json + weights, Hugging Face layout): {exc}"
            ) from exc
        self.model: Any = model.to(self.device)
        self.model.requires_grad_(False)
        self.model.train(False)
        self.config: Any = self.model.config
        self.vocab_size = int(self.config.vocab_size)
        # transformers 5.x names the cache argument ``cache`` and warns that ``past_key_values`` goes away;
        # the 4.x releases we support know only ``past_key_values``
        parameters = inspect.signature(type(self.model).forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"

    def new_cache(self) -> Any:
        return DynamicCache(config=self.config)

    @torch.inference_mode()
    def forward(self, token_ids: Sequence[int], cache: Any, start: int) -> torch.Tensor:
        """Feed ``token_ids`` at positions ``start...`` after ``cache`` (extended in place); last logits."""
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        positions = torch.arange(start, start + len(token_ids), dtype=torch.long, device=self.device).unsqueeze(0)
        out = self.model(input_ids=ids, position_ids=positions, use_cache=True, logits_to_keep=1,
                         **{self._cache_argument: cache})
        logits: torch.Tensor = out.logits[0, -1].float().cpu()
        return logits

    @staticmethod
    def cut_block(cache: Any, index: int, block_size: int) -> BlockKV:
        """A copy of block ``index`` (tokens ``index*block_size`` onwards) of ``cache``."""
        lo, hi = index * block_size, (index + 1) * block_size
        return tuple((layer.keys[0, :, lo:hi].clone(), layer.values[0, :, lo:hi].clone()) for layer in cache.layers)

    def assemble(self, blocks: Sequence[BlockKV]) -> Any:
        """A new cache holding ``blocks`` in order (empty when there are none)."""
        cache = self.new_cache()
        if not blocks:
            return cache
        for layer in range(len(blocks[0])):
            keys = torch.cat([b[layer][0] for b in blocks], dim=1).unsqueeze(0)
            values = torch.cat([b[layer][1] for b in blocks], dim=1).unsqueeze(0)
            cache.update(keys, values, layer)
        return cache
