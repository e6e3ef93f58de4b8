"""The engine contract every worker engine implements, and its domain types (no protobuf here).

An engine owns a KV cache and a batching loop. The worker's gRPC servicer drives it through
:class:`Engine`; the KV publisher drains :meth:`Engine.kv_events`. The simulated mocker engine
(``services/worker/mocker``) is the reference implementation; real engines plug in behind the same
protocol and must pass the same contract tests.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "cancelled"]



@dataclass(frozen=True)
class BatchingConfig:
    """Paged-KV capacity and continuous-batching limits shared by the engines that schedule themselves."""

    block_size: int = 16
    num_blocks: int = 16384
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    max_tokens_default: int = 1024

    def __post_init__(self) -> None:
        for name in ("block_size", "num_blocks", "max_num_seqs", "max_num_batched_tokens", "max_tokens_default"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")

@dataclass(frozen=True)
class EngineRequest:
    """One tokenized prompt plus sampling parameters, as an engine sees it."""

    request_id: str
    token_ids: Sequence[int]
    max_tokens: int = 0                       # 0: the engine's default
    stop: Sequence[str] = ()                  # stop strings; the matched one is not emitted
    stop_token_ids: Sequence[int] = ()        # end generation (the engine's EOS ids count too)
    ignore_eos: bool = False                  # keep going past EOS (stop_token_ids still stop)
    temperature: float | None = None          # accepted; the mocker does not sample
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    match_text: str = ""                      # text of the last user/tool message (scripted engines)
    cache_salt: str = ""                      # changes block hashes (per-tenant isolation)
    priority: int = 0                         # reserved: higher first when saturated


@dataclass(frozen=True)
class PromptInfo:
    """Prompt accounting, sent once with the first output after the prompt was prefilled.

    An engine that knows them reports how long the request waited for admission and how long its
    prefill took (tracing only: excluded from equality); ``None`` means unknown.
    """

    prompt_tokens: int
    cached_tokens: int
    queue_seconds: float | None = field(default=None, compare=False)
    prefill_seconds: float | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Usage:
    """Token accounting of a finished request."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class EngineOutput:
    """Every token produced for one request since the consumer's previous read."""

    token_ids: tuple[int, ...] = ()
    prompt: PromptInfo | None = None          # first output only
    finish_reason: FinishReason | None = None  # last output only
    usage: Usage | None = None                # last output only
    stop_string: str = ""                     # the stop string that ended generation, if any


@dataclass(frozen=True)
class StoredBlock:
    """A full KV block: chained sequence hash, the engine's own block id, and its token count."""

    block_hash: int
    engine_block_id: int
    token_count: int


@dataclass(frozen=True)
class KvStored:
    """Consecutive full blocks now cached; ``blocks[0]`` is the child of ``parent_hash``."""

    event_id: int
    parent_hash: int | None
    blocks: tuple[StoredBlock, ...]


@dataclass(frozen=True)
class KvRemoved:
    """Blocks evicted from the cache."""

    event_id: int
    block_hashes: tuple[int, ...]


@dataclass(frozen=True)
class KvCleared:
    """Every cached block of the worker is gone."""

    event_id: int


KvEvent = KvStored | KvRemoved | KvCleared


@dataclass(frozen=True)
class EngineInfo:
    """Static facts about an engine, published in heartbeats and ``Worker.Info``."""

    engine: str
    model: str
    block_size: int
    total_blocks: int
    max_model_len: int


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
        """Abort every request and stop the loop."""

    def kv_events(self) -> AsyncIterator[list[KvEvent]]:
        """Subscribe (immediately, on call) to KV events; each item is everything since the last read."""
        ...

    def info(self) -> EngineInfo:
        """Static facts: engine name, model, block size, capacity."""
        ...

    def stats(self) -> EngineStats:
        """Current load."""
        ...
