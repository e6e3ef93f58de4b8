"""A paged KV-cache block manager with prefix caching, modelled on vLLM's and Dynamo's mocker.

Invariants:

* Capacity is ``num_blocks`` physical blocks of ``block_size`` tokens. Every block is exactly one
  of: free, *active* (referenced by at least one sequence), or *inactive* (a full block no
  sequence references, kept for prefix reuse and evicted least-recently-used first, only when an
  allocation needs room).
* Full blocks are keyed by their chained sequence hash (``services.common.block_hash``) and shared
  between sequences (ref-counted). A sequence's last, partial block is private to it. When a
  partial block fills up and its hash is already cached, the sequence adopts the cached block and
  the private one is freed (no duplicate, no event).
* Events carry consecutive ids starting at 1: a newly cached full block emits ``KvStored`` (one
  event per run of consecutive blocks, with the parent hash), an eviction ``KvRemoved``, and
  :meth:`BlockManager.clear` ``KvCleared``. Removals are emitted before the stores of the same call.
* Failed allocations change nothing: :meth:`BlockManager.append` returns False and the caller
  decides (wait, or preempt another sequence).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.common.block_hash import chain, local_block_hashes, seed_for, sequence_hashes
from services.kvcore.domain import KvCleared, KvEvent, KvRemoved, KvStored, StoredBlock


@dataclass
class _Block:
    block_id: int
    block_hash: int | None = None  # None while partial
    ref_count: int = 0


class KvSequence:
    """One request's block table: the tokens whose KV it holds, its full blocks and partial block."""

    def __init__(self, salt: str = "") -> None:
        self.salt = salt
        self.seed = seed_for(salt)
        self.tokens: list[int] = []
        self.hashes: list[int] = []       # sequence hashes of the full blocks it references
        self.partial: _Block | None = None

    @property
    def num_blocks(self) -> int:
        return len(self.hashes) + (1 if self.partial is not None else 0)


class BlockManager:
    """Ref-counted, prefix-cached KV blocks with LRU eviction and KV events (see module docstring)."""

    def __init__(
        self, num_blocks: int, block_size: int, on_event: Callable[[KvEvent], None] | None = None
    ) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.total_blocks = num_blocks
        self.block_size = block_size
        self._free_ids = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self._full: dict[int, _Block] = {}
        self._inactive: OrderedDict[int, None] = OrderedDict()  # first = least recently used
        self._next_event_id = 1
        self.pending_events: list[KvEvent] = []
        self._on_event = on_event if on_event is not None else self.pending_events.append

    # -- accounting -----------------------------------------------------------------------------

    @property
    def free_blocks(self) -> int:
        """Blocks holding nothing."""
        return len(self._free_ids)

    @property
    def cached_blocks(self) -> int:
        """Inactive full blocks kept for reuse (evictable)."""
        return len(self._inactive)

    @property
    def active_blocks(self) -> int:
        """Blocks referenced by at least one sequence (full and partial)."""
        return self.total_blocks - self.free_blocks - self.cached_blocks

    @property
    def available_blocks(self) -> int:
        """Blocks an allocation may use: free plus evictable."""
        return self.free_blocks + self.cached_blocks

    def ref_count(self, block_hash: int) -> int:
        block = self._full.get(block_hash)
        return 0 if block is None else block.ref_count

    def lru_order(self) -> list[int]:
        """Hashes of inactive blocks, next to be evicted first."""
        return list(self._inactive)

    # -- prefix reuse ---------------------------------------------------------------------------

    def match_prefix(self, token_ids: Sequence[int], salt: str = "") -> int:
        """How many leading full blocks of ``token_ids`` are cached (no side effects)."""
        matched = 0
        for h in sequence_hashes(token_ids, self.block_size, salt):
            if h not in self._full:
                break
            matched += 1
        return matched

    def acquire_prefix(self, seq: KvSequence, token_ids: Sequence[int]) -> int:
        """Reference the cached leading blocks of ``token_ids`` for an empty ``seq``; return cached tokens.

        At least one token is always left to compute (as in vLLM), so a fully cached prompt reports
        ``len - 1`` rounded down to whole blocks.
        """
        if seq.tokens or seq.partial is not None:
            raise ValueError("acquire_prefix needs an empty sequence")
        limit = max(0, (len(token_ids) - 1) // self.block_size)
        hashes: list[int] = []
        for h in sequence_hashes(token_ids[: limit * self.block_size], self.block_size, seq.salt):
            block = self._full.get(h)
            if block is None:
                break
            self._ref(block)
            hashes.append(h)
        seq.hashes = hashes
        seq.tokens = list(token_ids[: len(hashes) * self.block_size])
        return len(seq.tokens)

    # -- allocation -----------------------------------------------------------------------------

    def blocks_needed(self, seq: KvSequence, n_tokens: int) -> int:
        """New blocks that appending ``n_tokens`` to ``seq`` would allocate."""
        room = 0
        if seq.partial is not None:
            room = self.block_size - (len(seq.tokens) - len(seq.hashes) * self.block_size)
        extra = max(0, n_tokens - room)
        return -(-extra // self.block_size)

    def can_append(self, seq: KvSequence, n_tokens: int) -> bool:
        return self.blocks_needed(seq, n_tokens) <= self.available_blocks

    def append(self, seq: KvSequence, token_ids: Sequence[int]) -> bool:
        """Hold KV for ``token_ids`` after ``seq``'s tokens; False (and no change) if blocks run out."""
        if not token_ids:
            return True
        if not self.can_append(seq, len(token_ids)):
            return False
        bs = self.block_size
        removed: list[int] = []
        runs: list[tuple[int | None, list[StoredBlock]]] = []
        pos = 0
        while pos < len(token_ids):
            if seq.partial is None:
                seq.partial = _Block(self._take_block_id(removed), ref_count=1)
            used = len(seq.tokens) - len(seq.hashes) * bs
            take = token_ids[pos : pos + bs - used]
            seq.tokens.extend(take)
            pos += len(take)
            if used + len(take) == bs:
                self._seal(seq, runs)
        if removed:
            self._emit(KvRemoved(self._event_id(), tuple(removed)))
        for parent, blocks in runs:
            self._emit(KvStored(self._event_id(), parent, tuple(blocks)))
        return True

    def free(self, seq: KvSequence) -> None:
        """Drop ``seq``'s references: full blocks become inactive (tail first in LRU order)."""
        for h in reversed(seq.hashes):
            block = self._full[h]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._inactive[h] = None
        if seq.partial is not None:
            self._free_ids.append(seq.partial.block_id)
        seq.tokens = []
        seq.hashes = []
        seq.partial = None

    def clear(self) -> bool:
        """Drop every cached block and emit ``KvCleared``; refused (False) while blocks are in use."""
        if self.active_blocks:
            return False
        for h in self._inactive:
            self._free_ids.append(self._full.pop(h).block_id)
        self._inactive.clear()
        self._emit(KvCleared(self._event_id()))
        return True

    def drain_events(self) -> list[KvEvent]:
        """Events collected by the default sink since the last drain."""
        out = list(self.pending_events)
        self.pending_events.clear()
        return out

    # -- internals ------------------------------------------------------------------------------

    def _ref(self, block: _Block) -> None:
        if block.ref_count == 0 and block.block_hash is not None:
            self._inactive.pop(block.block_hash, None)
        block.ref_count += 1

    def _take_block_id(self, removed: list[int]) -> int:
        if self._free_ids:
            return self._free_ids.pop()
        victim, _ = self._inactive.popitem(last=False)
        removed.append(victim)
        return self._full.pop(victim).block_id

    def _seal(self, seq: KvSequence, runs: list[tuple[int | None, list[StoredBlock]]]) -> None:
        """``seq``'s partial block just filled up: hash it and cache it (or adopt the cached twin)."""
        bs = self.block_size
        block = seq.partial
        assert block is not None
        start = len(seq.hashes) * bs
        (local,) = local_block_hashes(seq.tokens[start : start + bs], bs, seq.seed)
        parent = seq.hashes[-1] if seq.hashes else None
        h = chain(parent, local, seq.seed)
        seq.partial = None
        seq.hashes.append(h)
        twin = self._full.get(h)
        if twin is not None:
            self._free_ids.append(block.block_id)
            self._ref(twin)
            return
        block.block_hash = h
        self._full[h] = block
        stored = StoredBlock(h, block.block_id, bs)
        if runs and runs[-1][1][-1].block_hash == parent:
            runs[-1][1].append(stored)
        else:
            runs.append((parent, [stored]))

    def _event_id(self) -> int:
        event_id = self._next_event_id
        self._next_event_id += 1
        return event_id

    def _emit(self, event: KvEvent) -> None:
        self._on_event(event)
