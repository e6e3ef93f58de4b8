"""The torch engine's paged prefix cache: KV tensors of full blocks, keyed by chained block hash.

Bookkeeping (ref counts, LRU eviction, stored/removed/cleared events with consecutive ids) is the
engine core's :class:`~services.kvcore.block_manager.BlockManager`; this store only follows its events,
so this engine's KV events have exactly the mocker's form and hashes (``services.common.block_hash``).
The core seals a block when its step is *scheduled*; its KV exists once the step's forward ran, so a
``KvStored`` block waits (:meth:`awaiting`) until the step completes and :meth:`store` gets its tensors.
Removed and cleared blocks lose their tensors. Every tensor held here belongs to a block the manager knows.
"""

from __future__ import annotations

from services.kvcore.domain import KvCleared, KvEvent, KvRemoved, KvStored
from services.worker.torch_engine.runner import BlockKV


class PagedKvCache:
    """Full-block KV tensors following the block manager's events; see the module docstring."""

    def __init__(self) -> None:
        self._kv: dict[int, BlockKV] = {}
        self._awaiting: set[int] = set()   # sealed by a scheduled step whose forward has not returned

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._kv

    def hashes(self) -> set[int]:
        """Every block whose KV is held (referenced or cached)."""
        return set(self._kv)

    def get(self, block_hash: int) -> BlockKV | None:
        """The block's KV, or None while its step is still computing it."""
        return self._kv.get(block_hash)

    def awaiting(self, block_hash: int) -> bool:
        """Sealed by a scheduled step; its tensors come when that step completes."""
        return block_hash in self._awaiting

    def store(self, block_hash: int, kv: BlockKV) -> None:
        """The KV of a block sealed at schedule time (ignored if the block was dropped meanwhile)."""
        if block_hash in self._awaiting:
            self._awaiting.discard(block_hash)
            self._kv[block_hash] = kv

    def on_event(self, event: KvEvent) -> None:
        """Follow the block manager: stored blocks await tensors, removed / cleared ones lose them."""
        if isinstance(event, KvStored):
            self._awaiting.update(b.block_hash for b in event.blocks)
        elif isinstance(event, KvRemoved):
            for h in event.block_hashes:
                self._kv.pop(h, None)
                self._awaiting.discard(h)
        elif isinstance(event, KvCleared):
            self._kv.clear()
            self._awaiting.clear()
