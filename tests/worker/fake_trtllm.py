"""A faithful fake of the part of TensorRT-LLM's LLM API the trtllm adapter uses (no GPU, no tensorrt_llm).

Modelled on TensorRT-LLM's documented objects: ``LLM.generate_async(prompt_token_ids, sampling_params,
streaming=True)`` returns a ``RequestOutput`` that is async-iterable, one item per executor iteration,
``outputs[0].token_ids_diff`` holding that iteration's new tokens and ``finish_reason`` in
``stop | length | cancelled``; ``abort()`` cancels it. Stop token ids and ``end_id`` end a request without
being emitted. ``get_kv_cache_events_async`` / ``get_stats_async`` drain dicts shaped like
``KVCacheEventSerializer`` / iteration stats. The KV cache reuses full blocks by prefix (radix lookup by
(parent hash, tokens)), evicts unreferenced blocks LRU, stores a request's last *partial* block when
it ends, and — as a variable sliding-window model would — mirrors every event for a second, smaller
attention window with different block hashes. Engine block hashes are unrelated to ours.
Generation is deterministic: the next token is a hash of the context, drawn from plain words.

Where the real library refuses or misbehaves, so does the fake (issue 17; each place names the
TensorRT-LLM source it mirrors, 1.x line):

* ``SamplingParams`` validates like ``tensorrt_llm/sampling_params.py`` (``_validate``), and a negative
  seed fails like the executor bindings' unsigned 64-bit ``SamplingConfig`` seed.
* A prompt longer than ``max_num_tokens`` is refused unless ``enable_chunked_prefill``
  (``tensorrt_llm/llmapi/llm.py``, ``_check_arguments``; default ``max_num_tokens`` 8,192 in
  ``tensorrt_llm/llmapi/llm_args.py``).
* The KV-event and stats queues exist only from the first ``generate_async``
  (``tensorrt_llm/executor/executor.py``, ``_maybe_initialize_iteration_results``): before it
  ``get_kv_cache_events_async`` fails its assertion and ``get_stats_async`` prints raw text to stderr;
  after it an empty queue polled with ``timeout=0`` raises ``asyncio.QueueEmpty``
  (``tensorrt_llm/llmapi/utils.py``, ``AsyncQueue.get``).
* No iteration stats without ``enable_iter_perf_stats`` (``tensorrt_llm/llmapi/llm_args.py``, default off).
* ``KvCacheConfig.tokens_per_block`` defaults to 32 (``llm_args.py``); ``forced_tokens_per_block`` plays an
  attention backend that runs with another size than asked, visible in ``llm.args.kv_cache_config`` and
  in the stats' ``tokensPerBlock``.
* Without ``skip_tokenizer_init`` the fake loads "the model's tokenizer" (``tokenizer_loads=False``: it
  cannot, and ``ModelLoader.load_hf_tokenizer`` then yields ``None``); a request without ``end_id`` and no
  tokenizer fails (``llm.py``, ``_prepare_sampling_params``).
* ``cached_tokens``: ``"engine"`` reports the reused prefix, ``"absent"`` has no such attribute (releases
  without it), ``"whole"`` reports the whole prompt (an implausible figure).
"""

from __future__ import annotations

import asyncio
import datetime
import struct
import sys
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import xxhash

from services.common.block_hash import sequence_hashes
from services.worker.trtllm.api import TrtllmModule

PRIORITY = 35
SWA_XOR = 0x5A5A_5A5A_5A5A_5A5A


@dataclass(kw_only=True)
class SamplingParams:
    """``tensorrt_llm.SamplingParams`` (the fields the adapter sets), validated as in ``sampling_params.py``."""

    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    detokenize: bool = True

    def __post_init__(self) -> None:
        if self.pad_id is None:
            self.pad_id = self.end_id
        # tensorrt_llm/sampling_params.py, SamplingParams._validate
        if self.top_p is not None and (self.top_p < 0 or self.top_p > 1):
            raise ValueError(f"require 0 <= top_p <= 1, got top_p={self.top_p}")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"require top_k >= 0, got top_k={self.top_k}")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"require temperature >= 0, got temperature={self.temperature}")


@dataclass(frozen=True)
class _TokenRangeRetentionConfig:
    """``KvCacheRetentionConfig.TokenRangeRetentionConfig(token_start, token_end, priority, duration_ms)``."""

    token_start: int
    token_end: int | None
    priority: int
    duration_ms: datetime.timedelta | None = None

    def __post_init__(self) -> None:  # executor.h: priorities run from 0 to 100
        assert 0 <= self.priority <= 100, self.priority


@dataclass(frozen=True, kw_only=True)
class KvCacheRetentionConfig:
    """``tensorrt_llm.llmapi.KvCacheRetentionConfig`` (the fields the adapter sets)."""

    TokenRangeRetentionConfig = _TokenRangeRetentionConfig
    token_range_retention_configs: list[_TokenRangeRetentionConfig]
    decode_retention_priority: int = 35
    decode_duration_ms: datetime.timedelta | None = None


@dataclass(kw_only=True)
class KvCacheConfig:
    """``tensorrt_llm.llmapi.KvCacheConfig`` (``tensorrt_llm/llmapi/llm_args.py``; the fields the adapter sets)."""

    enable_block_reuse: bool = True
    event_buffer_max_size: int = 0
    free_gpu_memory_fraction: float | None = None
    tokens_per_block: int = 32


class _IterationResult:
    """``tensorrt_llm.executor.result.IterationResult``: an async-iterable queue polled with a timeout."""

    def __init__(self) -> None:
        self.queue: deque[Any] = deque()
        self.timeout: float | None = 2

    def __aiter__(self) -> _IterationResult:
        return self

    async def __anext__(self) -> Any:
        if not self.queue:
            if self.timeout is None or self.timeout > 0:
                await asyncio.sleep(self.timeout or 0)
                if not self.queue:
                    raise TimeoutError
            else:
                raise asyncio.QueueEmpty  # tensorrt_llm/llmapi/utils.py, AsyncQueue.get with timeout <= 0
        return self.queue.popleft()


async def _empty() -> AsyncIterator[Any]:
    return
    yield


@dataclass
class CompletionOutput:
    """``tensorrt_llm.llmapi.CompletionOutput``."""

    index: int
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    _last_token_ids_len: int = 0

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len :]


class RequestOutput:
    """``tensorrt_llm.llmapi.RequestOutput`` in streaming mode: each ``__anext__`` applies one response."""

    def __init__(self, llm: FakeLLM, request_id: int, prompt: list[int], params: SamplingParams) -> None:
        self._llm = llm
        self.request_id = request_id
        self.prompt_token_ids = prompt
        self.sampling_params = params
        self.outputs = [CompletionOutput(0)]
        self.finished = False
        if llm.cached_tokens_mode != "absent":
            self.cached_tokens = 0
        self._responses: asyncio.Queue[tuple[list[int], str | None]] = asyncio.Queue()
        self.abort_requested = False

    def abort(self) -> None:
        self.abort_requested = True
        self._llm._wake.set()

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        out = self.outputs[0]
        out._last_token_ids_len = len(out.token_ids)
        tokens, reason = await self._responses.get()
        out.token_ids.extend(tokens)
        if reason is not None:
            out.finish_reason = reason
            self.finished = True
        return self


@dataclass(eq=False)
class _Block:
    engine_hash: int
    parent: int | None
    tokens: tuple[int, ...]
    path: tuple[int, ...]          # every token from the sequence start to this block's end
    refs: int = 0


@dataclass(eq=False)
class _Seq:
    result: RequestOutput
    tokens: list[int]               # prompt + generated, all with KV
    blocks: list[_Block] = field(default_factory=list)
    prefilled: bool = False


class FakeLLM:
    """``tensorrt_llm.LLM`` (see module docstring): the LLM's own keyword arguments, then the fake's knobs."""

    def __init__(self, vocab: Sequence[int], *, model: str = "", kv_cache_config: KvCacheConfig | None = None,
                 max_num_tokens: int = 8192, enable_chunked_prefill: bool = False,
                 enable_iter_perf_stats: bool = False, skip_tokenizer_init: bool = False,
                 num_blocks: int = 512, windows: tuple[int, int] = (32768, 64), tokenizer_loads: bool = True,
                 eos_token_id: int = 2, forced_tokens_per_block: int | None = None,
                 cached_tokens: str = "engine", **llm_kwargs: Any) -> None:
        config = kv_cache_config if kv_cache_config is not None else KvCacheConfig()
        self.vocab = list(vocab)
        self.bs = forced_tokens_per_block or config.tokens_per_block
        self.args = SimpleNamespace(
            model=model, max_num_tokens=max_num_tokens, enable_chunked_prefill=enable_chunked_prefill,
            enable_iter_perf_stats=enable_iter_perf_stats, skip_tokenizer_init=skip_tokenizer_init,
            kv_cache_config=KvCacheConfig(enable_block_reuse=config.enable_block_reuse,
                                          event_buffer_max_size=config.event_buffer_max_size,
                                          free_gpu_memory_fraction=config.free_gpu_memory_fraction,
                                          tokens_per_block=self.bs), **llm_kwargs)
        # llm.py, _try_load_tokenizer: None with skip_tokenizer_init, or when loading fails (a warning)
        self.tokenizer = None if skip_tokenizer_init or not tokenizer_loads else SimpleNamespace(
            eos_token_id=eos_token_id, pad_token_id=None)
        self.cached_tokens_mode = cached_tokens
        self.num_blocks = num_blocks
        self.window, self.small_window = windows
        self._blocks: dict[tuple[int | None, tuple[int, ...]], _Block] = {}
        self._lru: OrderedDict[int, _Block] = OrderedDict()   # unreferenced, evictable (full and partial)
        self._partials: list[_Block] = []
        self._events: deque[dict[str, Any]] = deque()         # the engine's event buffer
        self._kv_result: _IterationResult | None = None       # created by the first generate_async
        self._stats_result: _IterationResult | None = None
        self.early_polls = 0                                  # polls before the first request
        self.retention_configs: list[KvCacheRetentionConfig | None] = []  # per generate_async, in order
        self._next_event = 0
        self._next_request = 1
        self._active: list[_Seq] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.iterations = 0
        for window in (self.small_window, self.window):
            self._emit({"type": "created", "num_blocks_per_cache_level": [num_blocks, 0]}, window)

    # -- LLM API --------------------------------------------------------------------------------

    def generate_async(self, inputs: list[int], sampling_params: SamplingParams | None = None, *,
                       streaming: bool = False, kv_cache_retention_config: KvCacheRetentionConfig | None = None,
                       ) -> RequestOutput:
        assert streaming, "the adapter streams"
        self.retention_configs.append(kv_cache_retention_config)
        params = self._prepare_sampling_params(sampling_params)
        # llm.py, _check_arguments (PyTorch backend)
        if not self.args.enable_chunked_prefill and len(inputs) > self.args.max_num_tokens:
            raise ValueError(f"The sum of prompt length ({float(len(inputs))}), query length (0) should not exceed "
                             f"max_num_tokens ({self.args.max_num_tokens})")
        if params.seed is not None and not 0 <= params.seed < 1 << 64:
            # sampling_params.py, _get_sampling_config -> tllme.SamplingConfig(seed=...): an unsigned 64-bit int
            raise TypeError("__init__(): incompatible constructor arguments (seed must be an unsigned 64-bit int)")
        # executor.py, _maybe_initialize_iteration_results: the queues exist from the first request on
        if self._kv_result is None:
            self._kv_result = _IterationResult()
            self._stats_result = _IterationResult()
        result = RequestOutput(self, self._next_request, list(inputs), params)
        self._next_request += 1
        self._active.append(_Seq(result, list(inputs)))
        if self._task is None:
            self._task = asyncio.create_task(self._loop())
        self._wake.set()
        return result

    def get_kv_cache_events_async(self, timeout: float | None = 2) -> AsyncIterator[dict[str, Any]]:
        if self._kv_result is None:
            self.early_polls += 1
        # executor.py, GenerationExecutor.aget_kv_events
        assert self._kv_result is not None, "KV Event IterationResult is not properly instantiated."
        while self._events:
            self._kv_result.queue.append(self._events.popleft())
        self._kv_result.timeout = timeout
        return self._kv_result

    def get_stats_async(self, timeout: float | None = 2) -> AsyncIterator[Any]:
        if self._stats_result is None:
            self.early_polls += 1
            # executor.py, GenerationExecutor.aget_stats: print_colored, then an empty iterable
            sys.stderr.write("\x1b[33mIteration statistics are not available yet. To collect runtime statistics, "
                             "please call get_stats_async() in async coroutine or the /metrics endpoint (if "
                             "you're using trtllm-serve) AFTER prompts have been submitted.\n\x1b[0m")
            return _empty()
        self._stats_result.timeout = timeout
        return self._stats_result

    def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _prepare_sampling_params(self, params: SamplingParams | None) -> SamplingParams:
        """llm.py, _prepare_sampling_params: ``end_id`` from the tokenizer when the request has none."""
        params = params if params is not None else SamplingParams()
        if params.end_id is None:
            if self.tokenizer is None:
                raise ValueError("tokenizer is required to reset end_id if it is None, or you can explicitly "
                                 "specify the end_id for sampling_params")
            params.end_id = self.tokenizer.eos_token_id
            params.pad_id = self.tokenizer.pad_token_id or params.end_id
        return params

    # -- test helpers ---------------------------------------------------------------------------

    def cached_sequence_hashes(self) -> set[int]:
        """Our hashes of every full block the engine holds (global-attention window)."""
        return {sequence_hashes(b.path, self.bs)[-1] for b in self._blocks.values() if len(b.tokens) == self.bs}

    @property
    def used_blocks(self) -> int:
        return sum(1 for b in self._blocks.values() if b.refs > 0)

    # -- the executor loop ----------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            if not self._active:
                self._wake.clear()
                await self._wake.wait()
            await asyncio.sleep(0.0005)
            self.iterations += 1
            for seq in list(self._active):
                if seq.result.abort_requested:
                    self._finish(seq, [], "cancelled")
                else:
                    self._step(seq)
            if self.args.enable_iter_perf_stats and self._stats_result is not None:  # llm_args.py: off by default
                self._stats_result.queue.append({
                    "iter": self.iterations, "numActiveRequests": len(self._active), "kvCacheStats": {
                        "usedNumBlocks": self.used_blocks, "maxNumBlocks": self.num_blocks, "tokensPerBlock": self.bs,
                        "freeNumBlocks": self.num_blocks - self.used_blocks}})

    def _step(self, seq: _Seq) -> None:
        params = seq.result.sampling_params
        if not seq.prefilled:
            seq.prefilled = True
            limit = (len(seq.tokens) - 1) // self.bs
            parent: int | None = None
            for i in range(limit):
                block = self._blocks.get((parent, tuple(seq.tokens[i * self.bs : (i + 1) * self.bs])))
                if block is None:
                    break
                self._ref(block)
                self._emit({"type": "updated", "block_hash": block.engine_hash,
                            "cache_level": {"type": "event_diff", "old_value": 0, "new_value": 0},
                            "priority": {"type": "event_diff", "old_value": PRIORITY, "new_value": PRIORITY}},
                           self.window)
                seq.blocks.append(block)
                parent = block.engine_hash
            if self.cached_tokens_mode == "engine":
                seq.result.cached_tokens = len(seq.blocks) * self.bs
            elif self.cached_tokens_mode == "whole":
                seq.result.cached_tokens = len(seq.tokens)
            self._seal_full(seq)
        generated = seq.result.outputs[0].token_ids
        token = self._next_token(seq.tokens)
        if token in (params.stop_token_ids or []) or (token == params.end_id and not params.ignore_eos):
            self._finish(seq, [], "stop")
            return
        seq.tokens.append(token)
        self._seal_full(seq)
        reason = "length" if len(generated) + 1 >= params.max_tokens else None
        if reason is not None:
            self._finish(seq, [token], reason)
        else:
            seq.result._responses.put_nowait(([token], None))

    def _next_token(self, context: list[int]) -> int:
        data = struct.pack(f"<{min(len(context), 3) + 1}I", len(context), *context[-3:])
        return self.vocab[xxhash.xxh64_intdigest(data, seed=7) % len(self.vocab)]

    def _seal_full(self, seq: _Seq) -> None:
        """Blocks of ``seq`` that are full now are stored (reusing an identical cached block if any)."""
        run: list[_Block] = []
        run_parent: int | None = None
        while (len(seq.blocks) + 1) * self.bs <= len(seq.tokens):
            i = len(seq.blocks)
            parent = seq.blocks[-1].engine_hash if seq.blocks else None
            tokens = tuple(seq.tokens[i * self.bs : (i + 1) * self.bs])
            block = self._blocks.get((parent, tokens))
            if block is None:
                block = self._allocate(parent, tokens, tuple(seq.tokens[: (i + 1) * self.bs]))
                if not run:
                    run_parent = parent
                run.append(block)
            elif run:  # one stored event per run of consecutive new blocks
                self._emit_stored(run_parent, run)
                run = []
            self._ref(block)
            seq.blocks.append(block)
        if run:
            self._emit_stored(run_parent, run)

    def _finish(self, seq: _Seq, tokens: list[int], reason: str) -> None:
        self._active.remove(seq)
        tail = tuple(seq.tokens[len(seq.blocks) * self.bs :])
        parent = seq.blocks[-1].engine_hash if seq.blocks else None
        if tail and (parent, tail) not in self._blocks:
            partial = self._allocate(parent, tail, tuple(seq.tokens))
            self._emit_stored(parent, [partial])
            self._lru[partial.engine_hash] = partial
        for block in reversed(seq.blocks):
            block.refs -= 1
            if block.refs == 0:
                self._lru[block.engine_hash] = block
        seq.result._responses.put_nowait((tokens, reason))

    # -- block pool -----------------------------------------------------------------------------

    def _ref(self, block: _Block) -> None:
        if block.refs == 0:
            self._lru.pop(block.engine_hash, None)
        block.refs += 1

    def _allocate(self, parent: int | None, tokens: tuple[int, ...], path: tuple[int, ...]) -> _Block:
        if len(self._blocks) >= self.num_blocks:
            if not self._lru:
                raise RuntimeError("fake TensorRT-LLM: out of KV blocks")
            _, victim = self._lru.popitem(last=False)
            del self._blocks[(victim.parent, victim.tokens)]
            for window, h in ((self.small_window, victim.engine_hash ^ SWA_XOR), (self.window, victim.engine_hash)):
                self._emit({"type": "removed", "block_hashes": [h]}, window)
        data = struct.pack(f"<Q{len(tokens)}I", parent or 0, *tokens)
        block = _Block(xxhash.xxh64_intdigest(data, seed=99), parent, tokens, path)
        self._blocks[(parent, tokens)] = block
        return block

    def _emit_stored(self, parent: int | None, blocks: list[_Block]) -> None:
        for window, xor in ((self.small_window, SWA_XOR), (self.window, 0)):
            self._emit({"type": "stored", "parent_hash": None if parent is None else parent ^ xor, "blocks": [
                {"type": "stored_block", "block_hash": b.engine_hash ^ xor, "cache_level": 0, "priority": PRIORITY,
                 "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in b.tokens]}
                for b in blocks]}, window)

    def _emit(self, data: dict[str, Any], window: int) -> None:
        self._events.append({"event_id": self._next_event, "data": data, "window_size": window,
                             "attention_dp_rank": 0})
        self._next_event += 1


def fake_module(vocab: Sequence[int], **knobs: Any) -> TrtllmModule:
    """A :class:`TrtllmModule` whose ``LLM`` is :class:`FakeLLM` over ``vocab`` with the fake's ``knobs``."""

    def llm(**kwargs: Any) -> FakeLLM:
        return FakeLLM(vocab, **knobs, **kwargs)

    return TrtllmModule(llm, SamplingParams, KvCacheConfig, KvCacheRetentionConfig)
