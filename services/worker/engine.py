"""The engine contract every worker engine implements, and its domain types (no protobuf here).

An engine owns a KV cache and a batching loop. The worker's gRPC servicer drives it through
:class:`Engine`; the KV publisher drains :meth:`Engine.kv_events`. The mocker and torch engines are
the shared engine core (``services/kvcore``) plus their compute (``core_engine.py``); TensorRT-LLM
schedules itself. All pass the same contract tests.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

# The request / output / KV-event vocabulary is the engine core's (services/kvcore/domain.py); the
# contract speaks it, so it is re-exported here for the servicer, the publisher and the engines.
from services.kvcore.domain import (
    EngineOutput,
    EngineRequest,
    FinishReason,
    KvCleared,
    KvEvent,
    KvRemoved,
    KvStored,
    PromptInfo,
    StoredBlock,
    Usage,
)

__all__ = [
    "Engine", "EngineInfo", "EngineOutput", "EngineRequest", "EngineStats", "FinishReason", "KvCleared", "KvEvent",
    "KvRemoved", "KvStored", "PromptInfo", "StoredBlock", "Usage",
]


@dataclass(frozen=True)
class EngineInfo:
    """Static facts about an engine, published in heartbeats and ``Worker.Info``."""

    engine: str
    model: str
    block_size: int
    total_blocks: int
    max_model_len: int
    shortest_prefill_first: bool = False  # the scheduler's --prefill-order is shortest (the router counts its queue so)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of an engine's load."""

    active_requests: int                      # running + waiting
    running_requests: int
    waiting_requests: int
    active_blocks: int                        # blocks referenced by requests (incl. partial blocks)
    cached_blocks: int                        # unreferenced full blocks kept for prefix reuse
    total_blocks: int
    block_size: int
    steps: int = 0                            # engine steps run so far
    preemptions: int = 0
    extra: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    """What the worker needs from an engine.

    ``generate`` is an async generator: closing or cancelling it aborts the request and frees its
    KV blocks (in the generator's ``finally``). Validation errors (``InvalidRequestError``,
    ``ContextLengthError`` from ``services.common.errors``) are raised before the first output.
    """

    async def start(self) -> None:
        """Start the batching loop. Call once before ``generate``."""

    def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        """Stream outputs for ``request``; the last one carries ``finish_reason`` and ``usage``."""
        ...

    async def abort(self, request_id: str) -> None:
        """End a request now; its stream finishes with ``finish_reason="cancelled"``."""

    async def close(self) -> None:
        """Abort every request (each stream ends with ``finish_reason="cancelled"``) and stop the loop.

        Lifecycle guarantees every engine keeps (the conformance suite checks them):

        - idempotent: a second ``close()`` is a no-op;
        - null-safe: ``close()`` on an engine whose ``start()`` never ran, or raised part way, releases
          whatever exists and raises nothing (the worker's start-up closes the engine on any failure);
        - never concurrent with ``start()``: the caller awaits ``start()`` (or its failure) before closing,
          so an engine need not guard against the two overlapping.

        After ``close()``, ``generate`` is refused and ``kv_events`` subscriptions end.
        """

    def kv_events(self) -> AsyncIterator[list[KvEvent]]:
        """Subscribe (immediately, on call) to KV events; each item is everything since the last read."""
        ...

    def info(self) -> EngineInfo:
        """Static facts: engine name, model, block size, capacity."""
        ...

    def stats(self) -> EngineStats:
        """Current load."""
        ...
