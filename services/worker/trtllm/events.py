"""TensorRT-LLM KV cache event dicts -> our KV events (:class:`KvStored` / :class:`KvRemoved` / :class:`KvCleared`).

``LLM.get_kv_cache_events_async`` yields dicts shaped by TensorRT-LLM's ``KVCacheEventSerializer``::

    {"event_id": 7, "window_size": 4096, "attention_dp_rank": 0,    # the last two: newer releases
     "data": {"type": "created", "num_blocks_per_cache_level": [gpu_blocks, host_blocks]}}
    {"data": {"type": "stored", "parent_hash": h | None, "blocks": [
        {"type": "stored_block", "block_hash": h, "cache_level": 0, "priority": 35,
         "tokens": [{"type": "unique_token", "token_id": 11, "token_extra_id": 0}, ...]}, ...]}}
    {"data": {"type": "removed", "block_hashes": [h, ...]}}
    {"data": {"type": "updated", "block_hash": h, "cache_level": {"type": "event_diff", "old_value": 0,
              "new_value": 1}, "priority": {...}}}

Normalisation, as NVIDIA Dynamo's TensorRT-LLM publisher does it:

* Our own content hash: a stored block's sequence hash is computed from its token ids, chained on its
  parent's *our* hash (``services.common.block_hash``), so it matches the router's index and every
  other engine. The engine's block hash is kept only as an opaque id (``StoredBlock.engine_block_id``,
  as signed 64-bit) and to translate later ``removed`` events and parents.
* Partial blocks (fewer tokens than ``block_size``) end a stored event: they and the blocks after them
  are not published, and their later removal is not published either.
* Variable sliding-window models emit events per attention window. The initial ``created`` events
  announce the windows; after them only events of the largest (global attention) window pass.
* ``updated`` events (priority / cache level changes) carry nothing the router uses and are dropped;
  a ``created`` event after the initial ones means the cache was rebuilt: it becomes ``KvCleared``.
* Multimodal stored events (the new KV cache manager's: a block's ``token_id`` is the hex digest of an
  image or other item instead of an int, or the block carries ``mm_keys``) are skipped whole, as are the
  blocks chained on them and their removals: our hashes are over text token ids, and an item's digest
  would need the item's own routing identity to match another engine's. Each skipped stored event counts
  in :attr:`KvEventNormaliser.skipped` (``multimodal``), exported as a worker metric.
* Our event ids are consecutive from 1 (engine ids can skip because of the drops above).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from services.common.block_hash import chain, local_block_hashes, seed_for
from services.worker.engine import KvCleared, KvEvent, KvRemoved, KvStored, StoredBlock

log = structlog.get_logger()


def to_signed_i64(value: int) -> int:
    """Two's-complement view of an unsigned 64-bit engine hash (our ``engine_block_id`` is int64)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


class KvEventNormaliser:
    """Stateful translation of one engine's event stream (see module docstring)."""

    def __init__(self, block_size: int, salt: str = "") -> None:
        self.block_size = block_size
        self._seed = seed_for(salt)
        self._ours: dict[int, int] = {}  # engine block hash -> our sequence hash
        self._partial: set[int] = set()  # engine hashes of partial blocks (never published)
        self._skipped: set[int] = set()  # engine hashes of multimodal blocks and their descendants
        self._held: dict[int, int] = {}  # our hash -> how many engine blocks map to it
        self.skipped: dict[str, int] = {"multimodal": 0}  # stored events skipped, by reason
        self._initial_created = True
        self.max_window: int | None = None
        self.num_blocks: int | None = None  # GPU blocks, from the ``created`` event
        self._next_id = 1

    def published(self) -> set[int]:
        """Our hashes of the blocks published as stored and not yet removed."""
        return set(self._held)

    @property
    def published_any(self) -> bool:
        """Whether any block is published as held."""
        return bool(self._held)

    def cached_prefix(self, hashes: list[int]) -> int:
        """How many of ``hashes`` (a prompt's chained block hashes, in order) are held, from the first."""
        n = 0
        for h in hashes:
            if h not in self._held:
                break
            n += 1
        return n

    def feed(self, event: Mapping[str, Any]) -> list[KvEvent]:
        """Our events for one engine event (often none)."""
        data = event.get("data") or {}
        kind = data.get("type")
        if kind == "created":
            return self._created(event, data)
        if kind not in ("stored", "removed"):
            return []  # "updated" and unknown kinds
        self._initial_created = False
        if "window_size" in event and self.max_window is not None and event["window_size"] != self.max_window:
            return []  # a sliding-window layer group: the router indexes global attention blocks only
        if kind == "stored":
            return self._stored(data)
        return self._removed(data)

    # -- kinds ----------------------------------------------------------------------------------

    def _created(self, event: Mapping[str, Any], data: Mapping[str, Any]) -> list[KvEvent]:
        window = event.get("window_size")
        levels = data.get("num_blocks_per_cache_level") or []
        if self._initial_created:
            if isinstance(window, int) and (self.max_window is None or window > self.max_window):
                self.max_window = window
                if levels:
                    self.num_blocks = int(levels[0])
            elif self.max_window is None and levels:
                self.num_blocks = int(levels[0])
            return []
        if window is not None and self.max_window is not None and window != self.max_window:
            return []
        self._ours.clear()
        self._held.clear()
        self._partial.clear()
        self._skipped.clear()
        return [KvCleared(self._event_id())]

    def _stored(self, data: Mapping[str, Any]) -> list[KvEvent]:
        engine_parent = data.get("parent_hash")
        raw_blocks = data.get("blocks") or []
        if engine_parent in self._skipped or any(_multimodal(block) for block in raw_blocks):
            self.skipped["multimodal"] += 1
            self._skipped.update(b["block_hash"] for b in raw_blocks if b.get("block_hash") is not None)
            return []
        parent: int | None = None
        if engine_parent is not None:
            if engine_parent not in self._ours:
                log.warning("worker.trtllm_unknown_parent", engine_parent=engine_parent)
                return []  # its chain was never published (partial or dropped): nothing to hang it on
            parent = self._ours[engine_parent]
        blocks: list[StoredBlock] = []
        first_parent = parent
        for block in raw_blocks:
            engine_hash = block.get("block_hash")
            tokens = [int(t["token_id"]) for t in block.get("tokens") or []]
            if engine_hash is None:
                continue
            if len(tokens) > self.block_size:
                log.error("worker.trtllm_block_too_large", tokens=len(tokens), block_size=self.block_size)
                return []
            if len(tokens) < self.block_size:
                self._partial.add(engine_hash)
                break
            (local,) = local_block_hashes(tokens, self.block_size, self._seed)
            ours = chain(parent, local, self._seed)
            self._hold(engine_hash, ours)
            blocks.append(StoredBlock(ours, to_signed_i64(engine_hash), len(tokens)))
            parent = ours
        if not blocks:
            return []
        return [KvStored(self._event_id(), first_parent, tuple(blocks))]

    def _removed(self, data: Mapping[str, Any]) -> list[KvEvent]:
        removed: list[int] = []
        for engine_hash in data.get("block_hashes") or []:
            if engine_hash in self._partial or engine_hash in self._skipped:
                self._partial.discard(engine_hash)
                self._skipped.discard(engine_hash)
                continue
            ours = self._ours.pop(engine_hash, None)
            if ours is not None:
                removed.append(ours)
                left = self._held[ours] - 1
                if left:
                    self._held[ours] = left
                else:
                    del self._held[ours]
        if not removed:
            return []
        return [KvRemoved(self._event_id(), tuple(removed))]

    def _hold(self, engine_hash: int, ours: int) -> None:
        previous = self._ours.get(engine_hash)
        if previous == ours:
            return  # the same block stored again: still one engine block
        if previous is not None:
            self._held[previous] -= 1
            if not self._held[previous]:
                del self._held[previous]
        self._ours[engine_hash] = ours
        self._held[ours] = self._held.get(ours, 0) + 1

    def _event_id(self) -> int:
        event_id = self._next_id
        self._next_id += 1
        return event_id


def _multimodal(block: Mapping[str, Any]) -> bool:
    """A block of the multimodal KV cache manager: a digest (hex string) as a token id, or ``mm_keys``."""
    return bool(block.get("mm_keys")) or any(type(t.get("token_id")) is not int for t in block.get("tokens") or [])
