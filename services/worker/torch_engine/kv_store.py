"""The torch engine's paged prefix cache: KV tensors of full blocks, keyed by chained block hash.

Bookkeeping (ref counts, LRU eviction, stored/removed/cleared events with consecutive ids) is the
mocker's :class:`BlockManager`, used as-is, so this engine's KV events have exactly the mocker's
form and hashes (``services.common.block_hash``). This class adds the tensors: when the block
manager seals a block, its KV is copied out of the request's cache; when it evicts or clears
blocks, their tensors are dropped. Every tensor held here belongs to a block the manager knows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from services.worker.engine import KvCleared, KvEvent, KvRemoved
from services.worker.mocker.block_manager import BlockManager, KvSequence
from services.worker.torch_engine.runner import BlockKV, ModelRunner


class PagedKvCache:
    """Full-block KV tensors with prefix lookup; see the module docstring."""

    def __init__(self, num_blocks: int, block_size: int, on_event: Callable[[KvEvent], None]) -> None:
        self._forward = on_event
        self.blocks = BlockManager(num_blocks, block_size, self._on_event)
        self.block_size = block_size
        self._kv: dict[int, BlockKV] = {}

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._kv

    def hashes(self) -> set[int]:
        """Every block whose KV is held (referenced or cached)."""
        return set(self._kv)

    def acquire_prefix(self, seq: KvSequence, token_ids: Sequence[int]) -> list[BlockKV]:
        """Reference the longest cached full-block prefix of ``token_ids`` for empty ``seq``; its KV blocks.

        At least one token is left to compute, so the caller always gets logits for the next token.
        """
        self.blocks.acquire_prefix(seq, token_ids)
        return [self._kv[h] for h in seq.hashes]

    def can_hold(self, seq: KvSequence, n_tokens: int, reserved: int = 0) -> bool:
        """Whether ``n_tokens`` more tokens fit for ``seq`` beside ``reserved`` blocks promised elsewhere."""
        return self.blocks.blocks_needed(seq, n_tokens) + reserved <= self.blocks.available_blocks

    def commit(self, seq: KvSequence, token_ids: Sequence[int], cache: Any) -> bool:
        """``token_ids``' KV is now in ``cache`` after ``seq``'s tokens: take blocks, keep full ones' KV."""
        sealed_before = len(seq.hashes)
        if not self.blocks.append(seq, token_ids):
            return False
        for index in range(sealed_before, len(seq.hashes)):
            h = seq.hashes[index]
            if h not in self._kv:
                self._kv[h] = ModelRunner.cut_block(cache, index, self.block_size)
        return True

    def free(self, seq: KvSequence) -> None:
        """Drop ``seq``'s references; its full blocks stay cached until evicted."""
        self.blocks.free(seq)

    def clear(self) -> bool:
        return self.blocks.clear()

    def _on_event(self, event: KvEvent) -> None:
        if isinstance(event, KvRemoved):
            for h in event.block_hashes:
                self._kv.pop(h, None)
        elif isinstance(event, KvCleared):
            self._kv.clear()
        self._forward(event)
