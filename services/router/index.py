"""The KV index: which worker holds which prefix block, built from the workers' KV events.

Keys are chained block hashes (see ``services.common.block_hash``): a block's hash names its whole
prefix, so matching a request walks its block hashes in order and stops at the first block no
candidate holds — O(matched blocks), independent of how many blocks the index holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StoredEvent:
    """Blocks now held by a worker (each the child of the one before)."""

    event_id: int
    block_hashes: tuple[int, ...]


@dataclass(frozen=True)
class RemovedEvent:
    """Blocks a worker evicted."""

    event_id: int
    block_hashes: tuple[int, ...]


@dataclass(frozen=True)
class ClearedEvent:
    """A worker dropped its whole cache."""

    event_id: int


KvEvent = StoredEvent | RemovedEvent | ClearedEvent


class KvIndex:
    """Block hash -> workers holding it, plus each worker's own block set."""

    def __init__(self) -> None:
        self._holders: dict[int, set[str]] = {}
        self._blocks: dict[str, set[int]] = {}
        self._last_event_id: dict[str, int] = {}
        self.gaps_seen = 0

    def apply(self, worker_id: str, events: Iterable[KvEvent]) -> None:
        """Apply one worker's events in order. Ids that skip ahead are counted as gaps."""
        blocks = self._blocks.setdefault(worker_id, set())
        for event in events:
            last = self._last_event_id.get(worker_id)
            if last is not None and event.event_id <= last:
                continue  # duplicate or replayed event already applied
            if last is not None and event.event_id != last + 1:
                self.gaps_seen += 1
            self._last_event_id[worker_id] = event.event_id
            if isinstance(event, StoredEvent):
                for block in event.block_hashes:
                    blocks.add(block)
                    self._holders.setdefault(block, set()).add(worker_id)
            elif isinstance(event, RemovedEvent):
                for block in event.block_hashes:
                    self._drop(worker_id, block)
            else:
                for block in list(blocks):
                    self._drop(worker_id, block)

    def _drop(self, worker_id: str, block: int) -> None:
        self._blocks.get(worker_id, set()).discard(block)
        holders = self._holders.get(block)
        if holders is not None:
            holders.discard(worker_id)
            if not holders:
                del self._holders[block]

    def remove_worker(self, worker_id: str) -> None:
        for block in self._blocks.pop(worker_id, set()):
            holders = self._holders.get(block)
            if holders is not None:
                holders.discard(worker_id)
                if not holders:
                    del self._holders[block]
        self._last_event_id.pop(worker_id, None)

    def overlaps(self, block_hashes: Sequence[int], candidates: Iterable[str]) -> dict[str, int]:
        """Leading blocks of ``block_hashes`` each candidate holds (0 for none)."""
        result = dict.fromkeys(candidates, 0)
        active = set(result)
        for depth, block in enumerate(block_hashes, start=1):
            holders = self._holders.get(block)
            if not holders:
                break
            active &= holders
            if not active:
                break
            for worker in active:
                result[worker] = depth
        return result

    def block_count(self, worker_id: str) -> int:
        return len(self._blocks.get(worker_id, ()))

    def workers(self) -> list[str]:
        return sorted(self._blocks)
