"""The domain types the core consumes and produces: requests, outputs, KV events (no protobuf here).

They are the vocabulary of the worker's Engine contract too (``services.worker.engine`` re-exports
them); defined here because the block manager, the scheduler and the output buffer speak them and
this package imports nothing from the worker.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Literal, NamedTuple

FinishReason = Literal["stop", "length", "cancelled"]


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
    match_text: str = ""                      # user/tool messages since the last assistant's (scripts)
    cache_salt: str = ""                      # changes block hashes (per-tenant isolation)
    priority: int = 0                         # reserved: higher first when saturated
    continued_tokens: int = 0                 # trailing prompt tokens an earlier attempt generated
    retention_hold_s: float = 0.0             # lease its KV blocks this long once it ends (kvcore/retention.py)
    retention_first: bool = False             # evict its KV blocks first once it ends
    retention_tool_call_hold_s: float = 0.0   # lease them this long if its output holds a tool-call marker
    retention_answer_first: bool = False      # evict them first if its output holds none (a sub-agent's answer)
    # ``token_ids`` packed as little-endian u32 (``services.common.token_bytes``) when the caller has them (the
    # worker's gRPC request carries them so): hashed and seeded from as they are, sparing two copies of a
    # 100k-token prompt (~0.1 ms) before its first token. Empty: not given. Not part of equality.
    packed: bytes = field(default=b"", compare=False, repr=False)


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


class StoredBlock(NamedTuple):
    """A full KV block: chained sequence hash, the engine's own block id, and its token count (a NamedTuple:
    made by the thousand when a long prompt is stored, twice as fast to build as a frozen dataclass)."""

    block_hash: int
    engine_block_id: int
    token_count: int


def stored_blocks(block_hashes: Iterable[int], block_ids: Iterable[int], token_count: int) -> list[StoredBlock]:
    """``StoredBlock(h, i, token_count)`` for each pair, in bulk: built as tuples in C (the NamedTuple's own
    ``__new__`` is a Python call per block, half the cost of storing a long prompt's blocks)."""
    return list(map(_new_tuple, repeat(StoredBlock), zip(block_hashes, block_ids, repeat(token_count))))


_new_tuple = tuple.__new__


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
