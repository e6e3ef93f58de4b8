"""Stored responses for ``previous_response_id`` and ``GET`` / ``DELETE /v1/responses/{id}``.

:class:`ResponseStorage` is what the endpoint needs; two implementations keep the same contract:

- :class:`ResponseStore` (``--responses-store memory``, the default): this process's memory, bounded two
  ways: at most ``max_entries`` responses (the least recently used goes first) and each lives ``ttl``
  seconds after it was stored or last read. Nothing survives a gateway restart and each replica has its
  own: a client needing continuity across replicas sends the whole conversation with ``store: false``
  (as Codex does). ``max_entries=0`` disables storing.
- ``JetStreamResponseStore`` (``jetstream_store.py``, ``--responses-store jetstream``): a NATS JetStream
  KV bucket every gateway replica shares (see docs/state.md).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from services.api import chat_pb2


@dataclass(frozen=True)
class StoredResponse:
    """A finished response: its conversation (without instructions) and the response object."""

    conversation: tuple[chat_pb2.Message, ...]
    response: dict[str, Any]


class ResponseStorage(Protocol):
    """Where finished responses are kept; ``where`` says so in the error a missing id gets."""

    ttl: float

    @property
    def where(self) -> str: ...

    async def put(self, response_id: str, conversation: Sequence[chat_pb2.Message],
                  response: dict[str, Any]) -> None: ...

    async def get(self, response_id: str) -> StoredResponse | None: ...

    async def delete(self, response_id: str) -> bool: ...


class ResponseStore:
    """LRU + TTL map of response id -> ``StoredResponse`` in memory; not thread-safe (one event loop)."""

    def __init__(self, max_entries: int = 1024, ttl: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.ttl = ttl
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, StoredResponse]] = OrderedDict()

    @property
    def where(self) -> str:
        return f"this server keeps responses in memory for {self.ttl:g} s"

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    async def put(self, response_id: str, conversation: Sequence[chat_pb2.Message],
                  response: dict[str, Any]) -> None:
        if self.max_entries <= 0:
            return
        self._entries[response_id] = (self._clock() + self.ttl, StoredResponse(tuple(conversation), response))
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    async def get(self, response_id: str) -> StoredResponse | None:
        self._expire()
        entry = self._entries.get(response_id)
        if entry is None:
            return None
        self._entries[response_id] = (self._clock() + self.ttl, entry[1])
        self._entries.move_to_end(response_id)
        return entry[1]

    async def delete(self, response_id: str) -> bool:
        return self._entries.pop(response_id, None) is not None

    def _expire(self) -> None:
        now = self._clock()
        # Entries are in last-touched order and every touch extends by the same ttl: expiry order too.
        while self._entries:
            key, (deadline, _) = next(iter(self._entries.items()))
            if deadline > now:
                break
            del self._entries[key]
