"""The ``trtllm-grpc`` engine: our :class:`Engine` contract over a ``trtllm-serve --grpc`` process.

The model runs in TensorRT-LLM's own server (its image, its process); this engine is a client of its
``trtllm.TrtllmService`` (:mod:`.client`). It shares the embedded adapter's (``services/worker/trtllm``)
conventions rather than copying them: ``sampling_kwargs`` validates and maps sampling values,
:class:`KvEventNormaliser` translates KV events, and a kvcore :class:`RequestStream` applies stop strings,
stop tokens and ``max_tokens`` exactly as every other engine does.

* ``start`` waits (up to ``connect_timeout``) for ``HealthCheck`` to answer "OK" -- the server listens only
  once its model is loaded -- then reads ``GetModelInfo`` (a server ``max_seq_len`` below ours wins).
* ``generate`` streams ``Generate`` with token ids, ``temperature`` always set (the server's default is
  1.0, ours greedy), our EOS and stop ids as ``stop_token_ids``. The server's EOS is its tokenizer's (the
  schema has no ``end_id``). Closing the stream sends ``Abort`` and cancels the call.
* Cached prompt tokens: the server's figure when plausible (``0 < n < prompt``: its servicer sends 0 when
  the release has no figure), else our KV accounting, as the embedded adapter does.
* KV events: ``SubscribeKvEvents``, from the first request's first output (the server's event queue exists
  from then on; subscribed earlier, the servicer's drain fails), resubscribed with backoff after a
  failure (events in the gap are lost, so a ``KvCleared`` goes out first when anything was published).
  The wire drops ``window_size``: for a model with one attention window that is what the embedded adapter
  does with releases before ``window_size``; for a variable sliding-window model (mixed ``layer_types``,
  Gemma 2/3, Cohere 2, gpt-oss) events of all windows would mix, so none are subscribed to and the
  router places this worker by load alone (``worker.trtllm_grpc_kv_events_off``). A server without the
  subscription (``UNIMPLEMENTED``) gives the same fallback.
* Load: the schema has no stats call, so ``active_blocks`` is our accounting of the running requests
  (their distinct prompt blocks plus what each generated); ``total_blocks`` is ``--num-blocks`` (the
  ``created`` event that carries the pool size is not sent over the wire).
* Retention hints (docs/agent-kv.md) are not sent: the schema's ``GenerateRequest.kv_cache_retention`` (a
  ``policy`` name and a ``config_json`` string, no schema for either) is read by no TensorRT-LLM servicer
  (``tensorrt_llm/grpc/smg/servicer.py`` submits every request without a ``KvCacheRetentionConfig``, and SMG's
  own router always sends none), so the server evicts plain LRU by priority 35; the embedded adapter
  (``services/worker/trtllm``), which calls ``generate_async`` itself, is the one that applies them.
* Block size: the wire does not carry ``tokens_per_block``; a stored event whose full blocks are longer
  or shorter than ours reveals the server's, and new requests are then refused (``UNAVAILABLE``) with the
  size to restart with.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from services.common.block_hash import sequence_hashes
from services.common.errors import InternalError, InvalidRequestError, UnavailableError, as_mesh_error
from services.common.model_dir import ModelDir
from services.kvcore.outputs import RequestStream, check_request
from services.worker.engine import EngineInfo, EngineOutput, EngineRequest, EngineStats, FinishReason, KvEvent
from services.worker.kv_feed import KvEventFeed
from services.worker.trtllm.api import special_ids
from services.worker.trtllm.engine import sampling_kwargs
from services.worker.trtllm.events import KvEventNormaliser
from services.worker.trtllm_grpc.client import Delta, GenerateParams, KvEventsUnavailable, ServerModel

log = structlog.get_logger()

_FINISH: dict[str, FinishReason] = {"stop": "stop", "stop_word": "stop", "length": "length",
                                    "cancelled": "cancelled", "timeout": "cancelled"}
_VSWA_MODEL_TYPES = frozenset({"gemma2", "gemma3", "gemma3_text", "cohere2", "gpt_oss"})


class TrtllmServiceLike(Protocol):
    """What the engine needs of :class:`services.worker.trtllm_grpc.client.TrtllmGrpcClient`."""

    target: str

    async def close(self) -> None: ...
    async def health(self, timeout: float = 5.0) -> str: ...
    async def model_info(self) -> ServerModel: ...
    async def abort(self, request_id: str) -> bool: ...
    def generate(self, params: GenerateParams) -> AsyncIterator[Delta]: ...
    def subscribe_kv_events(self) -> AsyncIterator[list[dict[str, Any]]]: ...


def variable_sliding_window(model: ModelDir) -> bool:
    """Whether the model mixes attention windows across layers (TensorRT-LLM then emits events per window)."""
    config = model.config
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and len(set(map(str, layer_types))) > 1:
        return True
    return str(config.get("model_type", "")) in _VSWA_MODEL_TYPES


@dataclass
class _Running:
    stream: RequestStream
    prompt_blocks: list[int]            # our hashes of the prompt's full blocks
    tokens: int                         # prompt + generated: the KV the server holds for it
    server_done: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class TrtllmGrpcEngine:
    """Implements :class:`services.worker.engine.Engine` over a TrtllmService server (see module docstring)."""

    name = "trtllm-grpc"

    def __init__(self, client: TrtllmServiceLike, model: ModelDir, *, block_size: int, num_blocks: int,
                 max_tokens_default: int, connect_timeout: float = 600.0,
                 resubscribe: tuple[float, float] = (0.05, 2.0)) -> None:
        self.client = client
        self.model = model
        self.block_size = block_size
        self.total_blocks = num_blocks
        self.max_tokens_default = max_tokens_default
        self._connect_timeout = connect_timeout
        self._resubscribe = resubscribe
        self._end_id, self._pad_id = special_ids(model)
        self.normaliser = KvEventNormaliser(block_size)
        self._feed = KvEventFeed()
        self._requests: dict[str, _Running] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._events_task: asyncio.Task[None] | None = None
        self._max_model_len = model.max_model_len
        self._started = self._closed = False
        self._refusal: str | None = None
        self.kv_events_mode = "off" if variable_sliding_window(model) else "pending"  # -> subscribed | unavailable
        self.subscriptions = 0
        self.steps = 0

    # -- Engine contract ------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._connect_timeout
        status, delay = "", 0.1
        while True:
            with contextlib.suppress(UnavailableError):
                status = await self.client.health(timeout=min(5.0, self._connect_timeout))
                if status == "OK":
                    break
            if loop.time() + delay > deadline:
                raise UnavailableError(f"trtllm-serve at {self.client.target} did not become healthy within "
                                       f"{self._connect_timeout:g} s (last status: {status or 'unreachable'})")
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)
        server = await self.client.model_info()
        if 0 < server.max_seq_len < self._max_model_len:
            self._max_model_len = server.max_seq_len
        if self.kv_events_mode == "off":
            log.warning("worker.trtllm_grpc_kv_events_off", reason="variable sliding-window model: the wire "
                        "drops window_size, so events of different attention windows cannot be told apart")
        log.info("worker.trtllm_grpc_connected", target=self.client.target, server_model=server.model_id,
                 server_max_seq_len=server.max_seq_len, max_model_len=self._max_model_len)
        self._started = True

    async def close(self) -> None:
        self._closed = True
        for request_id, running in list(self._requests.items()):
            running.stream.finish("cancelled")
            if not running.server_done:
                self._spawn(self._abort_on_server(request_id))
        if self._events_task is not None:
            self._events_task.cancel()
        pending = [t for t in (self._events_task, *self._background) if t is not None]
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.client.close()
        self._feed.close()

    async def abort(self, request_id: str) -> None:
        running = self._requests.get(request_id)
        if running is not None:
            running.stream.finish("cancelled")
            await self._abort_on_server(request_id)

    def kv_events(self) -> AsyncIterator[list[KvEvent]]:
        return self._feed.subscribe()

    def info(self) -> EngineInfo:
        return EngineInfo(self.name, self.model.name, self.block_size, self.total_blocks, self._max_model_len)

    def stats(self) -> EngineStats:
        prompt_blocks: set[int] = set()
        beyond = 0
        for running in self._requests.values():
            prompt_blocks.update(running.prompt_blocks)
            beyond += -(-running.tokens // self.block_size) - len(running.prompt_blocks)
        active = len(prompt_blocks) + beyond
        extra = {f"kv_events_skipped_{reason}": float(n) for reason, n in self.normaliser.skipped.items()}
        extra["kv_subscriptions"] = float(self.subscriptions)
        return EngineStats(active_requests=len(self._requests), running_requests=len(self._requests),
                           waiting_requests=0, active_blocks=active,
                           cached_blocks=max(0, len(self.normaliser.published()) - active),
                           total_blocks=self.total_blocks, block_size=self.block_size, steps=self.steps, extra=extra)

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        if self._closed or not self._started:
            raise InternalError("the engine is not running")
        if self._refusal is not None:
            raise UnavailableError(self._refusal)
        checked = check_request(request, self.model, capacity_tokens=self.total_blocks * self.block_size,
                                max_tokens_default=self.max_tokens_default, max_model_len=self._max_model_len)
        request_id = checked.request.request_id
        if request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id!r} is already running", param="request_id")
        end_id = self._end_id if self._end_id is not None else -1
        kwargs = sampling_kwargs(checked, end_id, self._pad_id if self._pad_id is not None else end_id)
        prompt = list(checked.request.token_ids)
        params = GenerateParams(request_id=request_id, token_ids=prompt, max_tokens=checked.max_tokens,
                                stop_token_ids=sorted(checked.stop_ids), ignore_eos=checked.request.ignore_eos,
                                temperature=kwargs.get("temperature", 0.0), top_p=kwargs.get("top_p"),
                                top_k=kwargs.get("top_k"), seed=kwargs.get("seed"))
        usable = (len(prompt) - 1) // self.block_size
        prompt_blocks = sequence_hashes(prompt[: usable * self.block_size], self.block_size) if usable > 0 else []
        ours = self.normaliser.cached_prefix(prompt_blocks) * self.block_size if self.normaliser.published_any else 0
        running = _Running(RequestStream(checked, self.model.tokenizer), prompt_blocks, len(prompt))
        self._requests[request_id] = running
        reader = asyncio.create_task(self._read(running, params, ours), name=f"trtllm-grpc-{request_id}")
        try:
            async for out in running.stream.outputs():
                yield out
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            if not running.server_done:
                self._spawn(self._abort_on_server(request_id))
            if self._requests.get(request_id) is running:
                del self._requests[request_id]

    # -- internals ------------------------------------------------------------------------------

    async def _read(self, running: _Running, params: GenerateParams, ours: int) -> None:
        stream, prompt_tokens = running.stream, len(params.token_ids)
        try:
            async for delta in self.client.generate(params):
                self.steps += 1
                self._start_events()
                reported = delta.cached_tokens
                stream.prompt_done(reported if 0 < reported < prompt_tokens else ours)
                running.tokens += len(delta.token_ids)
                for token in delta.token_ids:
                    if stream.deliver(token):
                        break
                if delta.finish_reason is not None:
                    running.server_done = True
                    stream.finish(_FINISH.get(delta.finish_reason, "stop"))
                    return
                if stream.finished:
                    return  # a stop string or token we enforce ourselves: the caller aborts on the server
            running.server_done = True
            stream.finish("stop")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            running.server_done = True  # the server's handler has ended (and aborted the request)
            log.warning("worker.trtllm_grpc_request_failed", request_id=stream.request_id, error=str(exc))
            stream.fail(as_mesh_error(exc))

    async def _abort_on_server(self, request_id: str) -> None:
        try:
            await self.client.abort(request_id)
        except Exception as exc:  # the call's cancellation aborts it too; this is the explicit twin
            log.info("worker.trtllm_grpc_abort_failed", request_id=request_id, error=str(exc))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _start_events(self) -> None:
        if self.kv_events_mode == "pending" and self._events_task is None and not self._closed:
            self._events_task = asyncio.create_task(self._events_loop(), name="trtllm-grpc-kv-events")

    async def _events_loop(self) -> None:
        low, high = self._resubscribe
        delay = low
        while not self._closed:
            try:
                self.subscriptions += 1
                async for batch in self.client.subscribe_kv_events():
                    self.kv_events_mode = "subscribed"
                    delay = low
                    for event in batch:
                        self._on_event(event)
            except KvEventsUnavailable as exc:
                self.kv_events_mode = "unavailable"
                log.warning("worker.trtllm_grpc_kv_events_unavailable", reason=str(exc),
                            fallback="no KV events: the router places this worker by load alone")
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("worker.trtllm_grpc_kv_subscription_failed", error=str(exc), retry_in=delay)
            if self.normaliser.published_any:  # what happened in the gap is unknown: start the router over
                for ours in self.normaliser.feed({"data": {"type": "created", "num_blocks_per_cache_level": []}}):
                    self._feed.emit(ours)
            await asyncio.sleep(delay)
            delay = min(high, delay * 2)

    def _on_event(self, event: dict[str, Any]) -> None:
        if self._refusal is not None:
            return
        data = event.get("data") or {}
        if data.get("type") == "stored":
            sizes = [len(b.get("tokens") or []) for b in data.get("blocks") or []]
            wrong = [s for s in sizes if s > self.block_size] or [s for s in sizes[:-1] if s != self.block_size]
            if wrong:
                self._refusal = (f"trtllm-serve's KV cache runs with {wrong[0]} tokens per block, not "
                                 f"{self.block_size}: restart the worker with --block-size {wrong[0]}")
                log.error("worker.trtllm_grpc_block_size_mismatch", engine_block_size=wrong[0],
                          block_size=self.block_size)
                return
        for ours in self.normaliser.feed(event):
            self._feed.emit(ours)
