"""The TensorRT-LLM engine: our :class:`Engine` contract over TensorRT-LLM's LLM API.

* ``generate`` submits the prompt's token ids with ``LLM.generate_async(..., streaming=True)`` and a
  ``SamplingParams`` mapped from the request by :func:`sampling_kwargs` (``max_tokens``, ``temperature``,
  ``top_p``, ``top_k``, ``seed``, ``ignore_eos``; ``end_id`` / ``pad_id`` from our model directory, the
  other EOS ids and ``stop_token_ids`` as ``stop_token_ids``; ``detokenize=False``).
  A per-request task reads each ``RequestOutput``: ``outputs[0].token_ids_diff`` (every token since
  the previous read) goes through the same :class:`RequestStream` as the torch engine's tokens, so
  stop strings, stop tokens and ``max_tokens`` behave identically on every engine; the engine's
  ``finish_reason`` ends the stream. Closing / cancelling the stream, a matched stop string and
  :meth:`abort` call ``RequestOutput.abort()``.
* Cached prompt tokens: ``RequestOutput.cached_tokens`` when the release reports it and the figure is
  plausible (``0 <= n < prompt``); otherwise our own KV accounting: the prompt's leading blocks that the
  engine's events had published as held when the request was submitted (NVIDIA Dynamo also treats the
  engine's field as unreliable).
* KV events and stats: TensorRT-LLM creates its event and stats queues on the first request; polled
  before that, every KV-event poll fails an assertion and every stats poll prints raw text to stdout /
  stderr. So, as NVIDIA Dynamo's publisher does, polling starts after the first request's first output:
  a task polls ``LLM.get_kv_cache_events_async(timeout=0)`` (``asyncio.QueueEmpty`` when nothing is
  queued; backing off while idle) and translates the events with :class:`KvEventNormaliser` (our
  content hashes; partial blocks, sliding-window groups and multimodal blocks dropped). Load:
  ``LLM.get_stats_async`` iteration stats (``enable_iter_perf_stats``): ``kvCacheStats.usedNumBlocks`` is
  ``active_blocks``; a ``tokensPerBlock`` other than ours stops new requests (``UNAVAILABLE``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any

import structlog

from services.common.block_hash import sequence_hashes
from services.common.errors import InternalError, InvalidRequestError, UnavailableError, as_mesh_error
from services.common.model_dir import ModelDir
from services.kvcore.config import BatchingConfig
from services.kvcore.outputs import CheckedRequest, RequestStream, check_request
from services.worker.engine import EngineInfo, EngineOutput, EngineRequest, EngineStats, FinishReason, KvEvent
from services.worker.kv_feed import KvEventFeed
from services.worker.trtllm.api import TrtllmApi
from services.worker.trtllm.events import KvEventNormaliser
from services.worker.trtllm.retention import retention_config

log = structlog.get_logger()

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "cancelled": "cancelled",
                                    "timeout": "cancelled"}
_U64 = (1 << 64) - 1


def sampling_kwargs(checked: CheckedRequest, end_id: int, pad_id: int) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments for a request, in TensorRT-LLM's conventions.

    TensorRT-LLM's ``SamplingParams._validate`` (``tensorrt_llm/sampling_params.py``) requires
    ``0 <= top_p <= 1``, ``top_k >= 0`` and ``temperature >= 0``, and its seed is an unsigned 64-bit
    integer. Mapped: ``top_k`` -1 or 0 (the OpenAI / vLLM spelling of "no top-k") is left unset, which is
    TensorRT-LLM's "off"; a negative seed is its two's-complement unsigned value (distinct seeds stay
    distinct). Refused before the request reaches the engine, as :class:`InvalidRequestError` (a 400 at
    the edge): ``temperature < 0``, ``top_p`` outside [0, 1], ``top_k < -1``.
    """
    req = checked.request
    kwargs: dict[str, Any] = {
        "max_tokens": checked.max_tokens,
        "end_id": end_id,
        "pad_id": pad_id,
        "stop_token_ids": sorted(checked.stop_ids - {end_id}) or None,
        "ignore_eos": req.ignore_eos,
        "detokenize": False,
    }
    if req.temperature is not None:
        if not req.temperature >= 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {req.temperature}", param="temperature")
        kwargs["temperature"] = req.temperature
    if req.top_p is not None:
        if not 0 <= req.top_p <= 1:
            raise InvalidRequestError(f"top_p must be between 0 and 1, got {req.top_p}", param="top_p")
        kwargs["top_p"] = req.top_p
    if req.top_k is not None:
        if req.top_k < -1:
            raise InvalidRequestError(f"top_k must be -1 (off), 0 (off) or positive, got {req.top_k}",
                                      param="top_k")
        if req.top_k > 0:
            kwargs["top_k"] = req.top_k
    if req.seed is not None:
        kwargs["seed"] = req.seed & _U64
    return kwargs


class TrtllmEngine:
    """Implements :class:`services.worker.engine.Engine` over a TensorRT-LLM ``LLM`` (see module docstring)."""

    name = "trtllm"

    def __init__(
        self,
        api: TrtllmApi,
        model: ModelDir,
        *,
        num_blocks: int,
        max_tokens_default: int = BatchingConfig.max_tokens_default,
        poll_interval: float = 0.005,
        max_poll_interval: float = 0.05,
    ) -> None:
        self.api = api
        self.model = model
        self.block_size = api.block_size  # the engine's real one (load_llm read it back)
        self._num_blocks = num_blocks
        self.max_tokens_default = max_tokens_default
        self._poll = (poll_interval, max_poll_interval)
        self._feed = KvEventFeed()
        self.normaliser = KvEventNormaliser(api.block_size)
        self._requests: dict[str, tuple[RequestStream, Any]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._started = False
        self._kv_stats: dict[str, Any] = {}
        self._refusal: str | None = None  # set when the engine turns out unusable (block size mismatch)
        self.steps = 0

    # -- Engine contract ------------------------------------------------------------------------

    async def start(self) -> None:
        self._started = True  # polling starts with the first request's first output (module docstring)

    @property
    def polling(self) -> bool:
        """Whether the KV-event and stats polls run (after the first request's first output)."""
        return bool(self._tasks)

    def _start_polling(self) -> None:
        if self._tasks or self._closed:
            return
        self._tasks = [
            asyncio.create_task(self._poll_loop(self.api.llm.get_kv_cache_events_async, self._on_kv_event),
                                name="trtllm-kv-events"),
            asyncio.create_task(self._poll_loop(self.api.llm.get_stats_async, self._on_stats), name="trtllm-stats"),
        ]

    async def close(self) -> None:
        self._closed = True
        for stream, result in list(self._requests.values()):
            with contextlib.suppress(Exception):
                result.abort()
            stream.finish("cancelled")
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.api.llm.shutdown)
        self._feed.close()

    async def abort(self, request_id: str) -> None:
        entry = self._requests.get(request_id)
        if entry is not None:
            stream, result = entry
            result.abort()
            stream.finish("cancelled")

    def kv_events(self) -> AsyncIterator[list[KvEvent]]:
        return self._feed.subscribe()

    def info(self) -> EngineInfo:
        return EngineInfo(self.name, self.model.name, self.block_size, self.total_blocks, self.model.max_model_len)

    @property
    def total_blocks(self) -> int:
        return self.normaliser.num_blocks or int(self._kv_stats.get("maxNumBlocks") or self._num_blocks)

    def stats(self) -> EngineStats:
        active = len(self._requests)
        used = int(self._kv_stats.get("usedNumBlocks") or 0)
        return EngineStats(
            active_requests=active,
            running_requests=active,
            waiting_requests=0,
            active_blocks=used,
            cached_blocks=max(0, len(self.normaliser.published()) - used),  # full blocks beyond those in use
            total_blocks=self.total_blocks,
            block_size=self.block_size,
            steps=self.steps,
            extra={f"kv_events_skipped_{reason}": float(n) for reason, n in self.normaliser.skipped.items()},
        )

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        if self._closed or not self._started:
            raise InternalError("the engine is not running")
        if self._refusal is not None:
            raise UnavailableError(self._refusal)
        checked = check_request(request, self.model, capacity_tokens=self.total_blocks * self.block_size,
                                max_tokens_default=self.max_tokens_default)
        request_id = checked.request.request_id
        if request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id!r} is already running", param="request_id")
        params = self.api.sampling_params(**sampling_kwargs(checked, self.api.end_id, self.api.pad_id))
        ours = self._reused_prefix(checked.request.token_ids)
        stream = RequestStream(checked, self.model.tokenizer)
        retention = retention_config(self.api.retention_config, checked.request)
        extra = {"kv_cache_retention_config": retention} if retention is not None else {}
        result = self.api.llm.generate_async(list(checked.request.token_ids), sampling_params=params, streaming=True,
                                             **extra)
        self._requests[request_id] = (stream, result)
        reader = asyncio.create_task(self._read(stream, result, ours, len(checked.request.token_ids)),
                                     name=f"trtllm-{request_id}")
        try:
            async for out in stream.outputs():
                yield out
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            if not getattr(result, "finished", False):
                with contextlib.suppress(Exception):
                    result.abort()
            if self._requests.get(request_id, (None, None))[0] is stream:
                del self._requests[request_id]

    # -- internals ------------------------------------------------------------------------------

    def _reused_prefix(self, token_ids: Sequence[int]) -> int:
        """Prompt tokens in leading blocks our KV accounting says the engine holds (one token always computed)."""
        usable = (len(token_ids) - 1) // self.block_size
        if usable <= 0 or not self.normaliser.published_any:
            return 0
        return self.normaliser.cached_prefix(sequence_hashes(token_ids[: usable * self.block_size],
                                                             self.block_size)) * self.block_size

    @staticmethod
    def _cached_tokens(out: Any, prompt_tokens: int, ours: int) -> int:
        """The engine's ``cached_tokens`` when present and plausible, else ``ours``."""
        reported = getattr(out, "cached_tokens", None)
        if isinstance(reported, int) and not isinstance(reported, bool) and 0 <= reported < prompt_tokens:
            return reported
        return ours

    async def _read(self, stream: RequestStream, result: Any, ours: int, prompt_tokens: int) -> None:
        try:
            async for out in result:
                self.steps += 1
                self._start_polling()  # the engine's event and stats queues exist from now on
                completion = out.outputs[0]
                stream.prompt_done(self._cached_tokens(out, prompt_tokens, ours))
                for token in completion.token_ids_diff:
                    if stream.deliver(int(token)):
                        break
                if stream.finished:
                    if not out.finished:
                        result.abort()  # a stop string or token we enforce ourselves
                    return
                if completion.finish_reason is not None:
                    stream.finish(_FINISH.get(str(completion.finish_reason), "stop"))
                    return
            stream.finish("stop")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("worker.trtllm_request_failed", request_id=stream.request_id, error=str(exc))
            stream.fail(as_mesh_error(exc))

    async def _poll_loop(self, fetch: Callable[..., AsyncIterator[Any]], handle: Callable[[Any], None]) -> None:
        low, high = self._poll
        sleep = low
        while not self._closed:
            had_data = False
            try:
                async for item in fetch(timeout=0):
                    had_data = True
                    handle(item)
            except (TimeoutError, asyncio.QueueEmpty):
                pass
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("worker.trtllm_poll_failed", error=str(exc))
            sleep = low if had_data else min(high, sleep * 1.5)
            await asyncio.sleep(sleep)

    def _on_kv_event(self, event: Any) -> None:
        if isinstance(event, str):
            event = json.loads(event)
        for ours in self.normaliser.feed(event):
            self._feed.emit(ours)

    def _on_stats(self, stat: Any) -> None:
        if isinstance(stat, str):
            stat = json.loads(stat)
        kv = stat.get("kvCacheStats") if isinstance(stat, dict) else None
        if isinstance(kv, dict):
            self._kv_stats = kv
            real = kv.get("tokensPerBlock")
            if isinstance(real, int) and real != self.block_size and self._refusal is None:
                self._refusal = (f"TensorRT-LLM's KV cache runs with {real} tokens per block, not {self.block_size}: "
                                 f"restart the worker with --block-size {real}")
                log.error("worker.trtllm_block_size_mismatch", engine_block_size=real, block_size=self.block_size)
