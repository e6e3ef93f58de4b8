"""The TensorRT-LLM engine: our :class:`Engine` contract over TensorRT-LLM's LLM API.

* ``generate`` submits the prompt's token ids with ``LLM.generate_async(..., streaming=True)`` and a
  ``SamplingParams`` mapped from the request (``max_tokens``, ``temperature``, ``top_p``, ``top_k``,
  ``seed``, ``ignore_eos``; EOS and ``stop_token_ids`` as ``stop_token_ids``; ``detokenize=False``).
  A per-request task reads each ``RequestOutput``: ``outputs[0].token_ids_diff`` (every token since
  the previous read) goes through the same :class:`RequestStream` as the torch engine's tokens, so
  stop strings, stop tokens and ``max_tokens`` behave identically on every engine; the engine's
  ``finish_reason`` ends the stream. Closing / cancelling the stream, a matched stop string and
  :meth:`abort` call ``RequestOutput.abort()``.
* Cached prompt tokens come from ``RequestOutput.cached_tokens`` (0 when the release lacks it).
* KV events: a task polls ``LLM.get_kv_cache_events_async`` (backing off while idle, as Dynamo does)
  and translates them with :class:`KvEventNormaliser` (our content hashes, partial blocks and
  sliding-window groups dropped). Load: ``LLM.get_stats_async`` iteration stats (``kvCacheStats``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import structlog

from services.common.errors import InternalError, InvalidRequestError, as_mesh_error
from services.common.model_dir import ModelDir
from services.kvcore.config import BatchingConfig
from services.kvcore.outputs import CheckedRequest, RequestStream, check_request
from services.worker.engine import EngineInfo, EngineOutput, EngineRequest, EngineStats, FinishReason, KvEvent
from services.worker.kv_feed import KvEventFeed
from services.worker.trtllm.api import TrtllmApi
from services.worker.trtllm.events import KvEventNormaliser

log = structlog.get_logger()

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "cancelled": "cancelled",
                                    "timeout": "cancelled"}


class TrtllmEngine:
    """Implements :class:`services.worker.engine.Engine` over a TensorRT-LLM ``LLM`` (see module docstring)."""

    name = "trtllm"

    def __init__(
        self,
        api: TrtllmApi,
        model: ModelDir,
        *,
        block_size: int,
        num_blocks: int,
        max_tokens_default: int = BatchingConfig.max_tokens_default,
        poll_interval: float = 0.005,
        max_poll_interval: float = 0.05,
    ) -> None:
        self.api = api
        self.model = model
        self.block_size = block_size
        self._num_blocks = num_blocks
        self.max_tokens_default = max_tokens_default
        self._poll = (poll_interval, max_poll_interval)
        self._feed = KvEventFeed()
        self.normaliser = KvEventNormaliser(block_size)
        self._requests: dict[str, tuple[RequestStream, Any]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._started = False
        self._kv_stats: dict[str, Any] = {}
        self.steps = 0

    # -- Engine contract ------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        self._tasks = [
            asyncio.create_task(self._poll_loop(self.api.llm.get_kv_cache_events_async, self._on_kv_event),
                                name="trtllm-kv-events"),
            asyncio.create_task(self._poll_loop(self._stats_source(), self._on_stats), name="trtllm-stats"),
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
        )

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        if self._closed or not self._started:
            raise InternalError("the engine is not running")
        checked = check_request(request, self.model, capacity_tokens=self.total_blocks * self.block_size,
                                max_tokens_default=self.max_tokens_default)
        request_id = checked.request.request_id
        if request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id!r} is already running", param="request_id")
        stream = RequestStream(checked, self.model.tokenizer)
        result = self.api.llm.generate_async(list(checked.request.token_ids),
                                             sampling_params=self._sampling_params(checked), streaming=True)
        self._requests[request_id] = (stream, result)
        reader = asyncio.create_task(self._read(stream, result), name=f"trtllm-{request_id}")
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

    def _sampling_params(self, checked: CheckedRequest) -> Any:
        req = checked.request
        kwargs: dict[str, Any] = {
            "max_tokens": checked.max_tokens,
            "stop_token_ids": sorted(checked.stop_ids) or None,
            "ignore_eos": req.ignore_eos,
            "detokenize": False,
        }
        if req.temperature is not None:
            kwargs["temperature"] = req.temperature
        if req.top_p is not None:
            kwargs["top_p"] = req.top_p
        if req.top_k is not None:
            kwargs["top_k"] = req.top_k
        if req.seed is not None:
            kwargs["seed"] = req.seed
        return self.api.sampling_params(**kwargs)

    async def _read(self, stream: RequestStream, result: Any) -> None:
        try:
            async for out in result:
                self.steps += 1
                completion = out.outputs[0]
                stream.prompt_done(int(getattr(out, "cached_tokens", 0) or 0))
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

    def _stats_source(self) -> Callable[..., AsyncIterator[Any]]:
        get_stats = getattr(self.api.llm, "get_stats_async", None)
        if get_stats is None:
            async def nothing(timeout: float | None = None) -> AsyncIterator[Any]:
                await asyncio.sleep(3600)
                return
                yield
            return nothing
        return get_stats  # type: ignore[no-any-return]

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
