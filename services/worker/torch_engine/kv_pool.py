"""The torch engine's KV: one paged pool on the device, and the attention that reads and writes it.

:class:`KvPool` preallocates, per layer, ``num_blocks`` blocks of ``block_size`` tokens of keys and values
(``[num_blocks, block_size, kv_heads, head_dim]`` each). Block ``i`` of the pool is block id ``i`` of the engine
core's :class:`~services.kvcore.block_manager.BlockManager`, the only bookkeeper: a request's KV is the blocks its
block table (:meth:`BlockManager.block_ids`) names, a cached prefix is used where it lies (nothing is copied or
rebuilt), and a block the manager hands out again is simply overwritten.

:func:`paged_attention` is registered with transformers' ``AttentionInterface`` as :data:`ATTENTION_NAME` and
loaded as the model's attention implementation, so any Hugging Face causal LM whose attention goes through that
registry runs over the pool without a fork of its modelling code. A step's forward is one packed sequence
(every scheduled item's tokens, one after another, each with its own positions); the step's
:class:`StepBatch`, set for the forward's duration (:func:`step_context`), tells the attention where each token's
KV goes (``slots``) and which blocks each item attends over. Per layer, all items' new keys and values are
written first, then each item attends: an item admitted in the same step over a block another item computes
reads that block's keys of this very layer. Attention is PyTorch's SDPA over the gathered blocks (a contiguous
run of blocks is read in place), decodes of one step in one padded batch; the same code runs on CPU and CUDA.
A layer with a sliding window (``sliding_window`` from the model) attends over the last ``window`` keys only;
soft-capped attention logits (Gemma 2) and attention sinks (gpt-oss) are refused.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AttentionInterface

from services.kvcore.domain import KvCleared, KvEvent, KvRemoved, KvStored

ATTENTION_NAME = "harnessmesh_paged"


class KvPool:
    """Preallocated paged KV of every layer (see the module docstring)."""

    def __init__(self, config: Any, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device) -> None:
        layers = int(config.num_hidden_layers)
        heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        self.num_blocks, self.block_size, self.kv_heads, self.head_dim = num_blocks, block_size, heads, head_dim
        self.kv = torch.zeros(layers, 2, num_blocks, block_size, heads, head_dim, dtype=dtype, device=device)
        self.device = device

    @property
    def nbytes(self) -> int:
        return int(self.kv.numel() * self.kv.element_size())

    def blocks(self, layer: int, which: int) -> torch.Tensor:
        """Layer ``layer``'s keys (``which=0``) or values (1): ``[num_blocks, block_size, kv_heads, head_dim]``."""
        return self.kv[layer, which]


@dataclass
class ItemView:
    """One scheduled item in a packed step: its tokens' span in the packed sequence and the KV it attends over."""

    begin: int               # first of its tokens in the packed sequence
    count: int               # its tokens this step
    context: int             # tokens it attends over (its KV before the step plus its own)
    blocks: torch.Tensor     # a prefill's block table on the pool's device (a decode's is in StepBatch.decode_blocks)
    run: int | None          # first block id when the table is one contiguous run (read in place), else None
    mask: torch.Tensor | None = None  # [count, context] bool (None: a decode, or a fresh prompt with is_causal)


@dataclass
class StepBatch:
    """What one engine step's forward needs besides the tokens (see the module docstring)."""

    pool: KvPool
    slots: torch.Tensor                                   # pool slot (block id * block_size + offset) per token
    prefills: list[ItemView] = field(default_factory=list)
    decodes: list[ItemView] = field(default_factory=list)
    decode_rows: torch.Tensor | None = None               # packed index of each decode's token
    decode_blocks: torch.Tensor | None = None             # [decodes, most blocks] ids, padded with 0
    decode_mask: torch.Tensor | None = None               # [decodes, 1, 1, most blocks * block_size]
    decode_lengths: torch.Tensor | None = None            # each decode's context


def plan_batch(pool: KvPool, items: Sequence[tuple[int, int, Sequence[int]]]) -> StepBatch:
    """The batch of items given as ``(start, count, block table)``, packed in that order. Its tensors are made
    with a fixed number of torch calls per step plus a few per prefill (a decode adds none)."""
    bs, device = pool.block_size, pool.device
    slots: list[int] = []
    batch = StepBatch(pool, torch.empty(0))
    decode_tables: list[list[int]] = []
    begin = 0
    for start, count, table in items:
        context = start + count
        ids = list(table[: -(-context // bs)])
        if count == 1:
            slots.append(ids[start // bs] * bs + start % bs)
            batch.decodes.append(ItemView(begin, 1, context, _NO_BLOCKS, None))
            decode_tables.append(ids)
        else:
            slots.extend([ids[p // bs] * bs + p % bs for p in range(start, context)])
            contiguous = ids[-1] - ids[0] == len(ids) - 1 and ids == list(range(ids[0], ids[-1] + 1))
            view = ItemView(begin, count, context, torch.tensor(ids, dtype=torch.long).to(device),
                            ids[0] if contiguous else None)
            if start > 0:
                keys = torch.arange(context, device=device)
                queries = torch.arange(start, context, device=device)
                view.mask = keys.unsqueeze(0) <= queries.unsqueeze(1)
            batch.prefills.append(view)
        begin += count
    batch.slots = torch.tensor(slots, dtype=torch.long).to(device)
    if decode_tables:
        most = max(map(len, decode_tables))
        padded = [ids + [0] * (most - len(ids)) for ids in decode_tables]
        batch.decode_blocks = torch.tensor(padded, dtype=torch.long).to(device)
        lengths = batch.decode_lengths = torch.tensor([v.context for v in batch.decodes]).to(device)
        batch.decode_mask = (torch.arange(most * bs, device=device).unsqueeze(0) < lengths.unsqueeze(1))[:, None, None]
        batch.decode_rows = torch.tensor([v.begin for v in batch.decodes], dtype=torch.long).to(device)
    return batch


_NO_BLOCKS = torch.empty(0, dtype=torch.long)


_STEP: contextvars.ContextVar[StepBatch | None] = contextvars.ContextVar("harnessmesh_paged_step", default=None)


@contextlib.contextmanager
def step_context(batch: StepBatch) -> Iterator[None]:
    """Makes ``batch`` the one :func:`paged_attention` serves during a forward."""
    token = _STEP.set(batch)
    try:
        yield
    finally:
        _STEP.reset(token)


def _gather(blocks: torch.Tensor, view: ItemView) -> torch.Tensor:
    """``[kv_heads, context, head_dim]`` of one item: a view of a contiguous run, else gathered blocks."""
    if view.run is not None:
        picked = blocks[view.run : view.run + len(view.blocks)]
    else:
        picked = blocks.index_select(0, view.blocks)
    return picked.flatten(0, 1)[: view.context].transpose(0, 1)


def paged_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract (``query`` ``[1, heads, tokens, head_dim]``, keys and values
    ``[1, kv_heads, tokens, head_dim]``, output ``[1, tokens, heads, head_dim]``) over the pool."""
    batch = _STEP.get()
    if batch is None:
        raise RuntimeError(f"{ATTENTION_NAME} attention runs only inside a torch engine step (step_context)")
    if kwargs.get("softcap") or kwargs.get("s_aux") is not None:
        raise NotImplementedError("attention soft-capping and sinks are not supported by the paged attention")
    pool, layer = batch.pool, int(module.layer_idx)
    keys, values = pool.blocks(layer, 0), pool.blocks(layer, 1)
    flat_k, flat_v = keys.view(-1, pool.kv_heads, pool.head_dim), values.view(-1, pool.kv_heads, pool.head_dim)
    flat_k.index_copy_(0, batch.slots, key[0].transpose(0, 1).to(flat_k.dtype))
    flat_v.index_copy_(0, batch.slots, value[0].transpose(0, 1).to(flat_v.dtype))
    q = query[0]  # [heads, tokens, head_dim]
    out = torch.empty(q.shape[1], q.shape[0], q.shape[2], dtype=q.dtype, device=q.device)
    gqa = q.shape[0] != pool.kv_heads
    window = kwargs.get("sliding_window")  # this layer's, where the model slides (None: full attention)
    for view in batch.prefills:
        span = slice(view.begin, view.begin + view.count)
        k, v = _gather(keys, view).to(q.dtype), _gather(values, view).to(q.dtype)
        mask = view.mask if not window or view.context <= window else _sliding_mask(view, int(window), q.device)
        o = torch.nn.functional.scaled_dot_product_attention(
            q[:, span].unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask,
            is_causal=mask is None, scale=scaling, enable_gqa=gqa)
        out[span] = o[0].transpose(0, 1)
    if batch.decodes:
        assert batch.decode_blocks is not None and batch.decode_rows is not None
        n = len(batch.decodes)
        k = keys[batch.decode_blocks].flatten(1, 2).transpose(1, 2).to(q.dtype)  # [n, kv_heads, ctx, head_dim]
        v = values[batch.decode_blocks].flatten(1, 2).transpose(1, 2).to(q.dtype)
        only_decodes = not batch.prefills  # then the packed rows are the decodes, in order
        qd = (q if only_decodes else q[:, batch.decode_rows]).transpose(0, 1).unsqueeze(2)  # [n, heads, 1, dim]
        mask = batch.decode_mask
        if window and max(d.context for d in batch.decodes) > window:  # keys in (position - window, position]
            assert batch.decode_lengths is not None and mask is not None
            mask = mask & (torch.arange(mask.shape[-1], device=q.device) >= batch.decode_lengths[:, None, None, None]
                           - int(window))
        o = torch.nn.functional.scaled_dot_product_attention(
            qd, k, v, attn_mask=mask, scale=scaling, enable_gqa=gqa).reshape(n, q.shape[0], q.shape[2])
        if only_decodes:
            return o.unsqueeze(0), None
        out[batch.decode_rows] = o
    return out.unsqueeze(0), None


def _sliding_mask(view: ItemView, window: int, device: torch.device) -> torch.Tensor:
    """A prefill chunk's causal mask limited to the last ``window`` keys of each query (transformers' sliding
    window: a query at position p sees keys in (p - window, p])."""
    keys = torch.arange(view.context, device=device).unsqueeze(0)
    queries = torch.arange(view.context - view.count, view.context, device=device).unsqueeze(1)
    return (keys <= queries) & (keys > queries - window)


def register_attention() -> str:
    """Registers :func:`paged_attention` with transformers (idempotent); its name for ``attn_implementation``."""
    AttentionInterface.register(ATTENTION_NAME, paged_attention)
    return ATTENTION_NAME


class CachedHashes:
    """The hashes of the full blocks the block manager caches, followed from its KV events."""

    def __init__(self) -> None:
        self._hashes: set[int] = set()

    def hashes(self) -> set[int]:
        return set(self._hashes)

    def on_event(self, event: KvEvent) -> None:
        if isinstance(event, KvStored):
            self._hashes.update(b.block_hash for b in event.blocks)
        elif isinstance(event, KvRemoved):
            self._hashes.difference_update(event.block_hashes)
        elif isinstance(event, KvCleared):
            self._hashes.clear()
