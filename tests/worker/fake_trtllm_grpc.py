"""An in-process fake of ``trtllm-serve --grpc``: TensorRT-LLM's ``TrtllmService`` servicer over the fake LLM.

The real server (``tensorrt_llm/grpc/smg/server.py``) builds an ``LLM`` and serves
``TrtllmServiceServicer`` (``tensorrt_llm/grpc/smg/servicer.py``, earlier ``tensorrt_llm/grpc/grpc_servicer.py``)
through a ``GrpcRequestManager`` (``tensorrt_llm/grpc/smg/request_manager.py``). This fake serves the same
vendored proto over :class:`tests.worker.fake_trtllm.FakeLLM` (the fake of the LLM API the embedded adapter
is tested on), so the engine and the server disagree only where the real ones would. Behaviours, each
with the TensorRT-LLM source it mirrors:

* Generate (``servicer.py``, ``Generate``): no ``tokenized`` -> ``INVALID_ARGUMENT``; sampling values go
  through ``create_sampling_params_from_proto`` (``request_manager.py``: ``temperature`` and ``top_p``
  default to 1.0 when unset, ``top_k`` / ``seed`` passed as given, ``stop_token_ids``, ``ignore_eos``,
  ``detokenize=False``; no ``end_id``: the LLM takes it from the server's own tokenizer); a
  ``ValueError`` (``SamplingParams._validate``) -> ``INVALID_ARGUMENT``, anything else -> ``INTERNAL``,
  the request aborted first. Streaming: one ``chunk`` per executor iteration with the new tokens
  (computed from cumulative ``token_ids``, skipped when empty: ``_chunk_responses``), ``cached_tokens``
  from the result (0 when the release has no such attribute), then one ``complete`` with every output
  token and ``finish_reason`` (``_complete_responses``). A client that cancels the call gets the request
  aborted (``except asyncio.CancelledError``).
* Abort (``servicer.py`` / ``request_manager.py``, ``abort``): ``success`` iff the request was still tracked.
* HealthCheck: ``request_manager.health_check`` -> "OK" (the fake LLM has no ``_executor`` to be unhealthy).
* GetModelInfo: ``request_manager.get_model_config`` (``llm.args.model``; lengths 0 when ``args`` lacks them).
* SubscribeKvEvents (``tensorrt_llm/grpc/grpc_servicer.py`` with ``tensorrt_llm/grpc/kv_events.py``, as
  their unit test pins them): initial metadata first; ``UNIMPLEMENTED`` unless block reuse is on and
  ``event_buffer_max_size > 0``; drains ``llm.get_kv_cache_events_async``; one ``KvEventBatch`` per
  event, ``sequence_number`` counting from 0 per subscription, TensorRT-LLM's ``event_id`` kept,
  ``created`` / ``updated`` skipped, hashes reduced to int64, ``attention_dp_rank`` as ``dp_rank`` and
  ``window_size`` dropped. Subscribed before the first request, the drain's assertion escapes the handler
  (``UNKNOWN``); how a given release handles that is not in the sources read, so the engine must cope.
  ``with_subscription=False`` plays the releases whose servicer has no such method (the generated base
  class answers ``UNIMPLEMENTED``).

``single_window=True`` (default) plays a model with one attention window: the fake LLM's mirrored
sliding-window events are not produced. ``False`` keeps them (a variable sliding-window model).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from services.api import smg_common_pb2 as common_pb2
from services.api import trtllm_service_pb2 as pb2
from services.api import trtllm_service_pb2_grpc as pb2_grpc
from services.common.model_dir import ModelDir
from services.kvcore.tokens import FillerVocabulary
from tests.worker.fake_trtllm import FakeLLM, KvCacheConfig, RequestOutput, SamplingParams

_U64 = (1 << 64) - 1


def to_int64(value: int) -> int:
    """``tensorrt_llm/grpc/kv_events.py``, ``to_int64``."""
    masked = int(value) & _U64
    return masked - (1 << 64) if masked >= 1 << 63 else masked


class SingleWindowLLM(FakeLLM):
    """The fake LLM for a model with one attention window: only the global window's events."""

    def _emit(self, data: dict[str, Any], window: int) -> None:
        if window == self.window:
            super()._emit(data, window)


def convert_event(event: dict[str, Any]) -> common_pb2.KvCacheEvent | None:
    """``tensorrt_llm/grpc/kv_events.py``, ``convert_event``."""
    data = event.get("data") or {}
    kind = data.get("type")
    if kind == "stored":
        blocks = []
        for block in data.get("blocks", []):
            token_ids = [int(t["token_id"]) for t in block.get("tokens", [])]
            blocks.append(common_pb2.KvBlock(block_hash=to_int64(block["block_hash"]), token_ids=token_ids,
                                             block_size=len(token_ids)))
        stored = common_pb2.KvBlocksStored(blocks=blocks)
        if data.get("parent_hash") is not None:
            stored.parent_block_hash = to_int64(data["parent_hash"])
        return common_pb2.KvCacheEvent(event_id=int(event["event_id"]), stored=stored)
    if kind == "removed":
        return common_pb2.KvCacheEvent(event_id=int(event["event_id"]), removed=common_pb2.KvBlocksRemoved(
            block_hashes=[to_int64(h) for h in data.get("block_hashes", [])]))
    return None


@dataclass
class FakeTrtllmServer:
    """A running fake server: its address, the LLM behind it, and what it was asked."""

    llm: FakeLLM
    server: grpc.aio.Server
    port: int
    params: list[SamplingParams] = field(default_factory=list)
    requests: list[pb2.GenerateRequest] = field(default_factory=list)  # as they came over the wire
    aborts: list[str] = field(default_factory=list)
    subscriptions: int = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        await self.server.stop(None)
        self.llm.shutdown()


class FakeTrtllmServicer(pb2_grpc.TrtllmServiceServicer):
    """``TrtllmServiceServicer`` + ``GrpcRequestManager`` over a fake LLM (see module docstring)."""

    def __init__(self, state: FakeTrtllmServer, *, with_subscription: bool, fail_subscriptions: int) -> None:
        self.state = state
        self.llm = state.llm
        self._rid_to_result: dict[str, RequestOutput] = {}
        self._with_subscription = with_subscription
        self._fail_subscriptions = fail_subscriptions

    # -- request_manager.py ---------------------------------------------------------------------

    async def _manager_generate(self, request_id: str, prompt: list[int],
                                params: SamplingParams) -> AsyncIterator[RequestOutput]:
        try:
            result = self.llm.generate_async(prompt, params, streaming=True)
            self._rid_to_result[request_id] = result
            async for out in result:
                yield out
                if out.finished:
                    break
        except asyncio.CancelledError:
            await self._manager_abort(request_id)
            raise
        finally:
            self._rid_to_result.pop(request_id, None)

    async def _manager_abort(self, request_id: str) -> bool:
        self.state.aborts.append(request_id)
        result = self._rid_to_result.pop(request_id, None)
        if result is None:
            return False
        result.abort()
        return True

    @staticmethod
    def sampling_params(request: pb2.GenerateRequest) -> SamplingParams:
        """``create_sampling_params_from_proto``, for the fields the fake ``SamplingParams`` has."""
        config = request.sampling_config
        kwargs: dict[str, Any] = {
            "max_tokens": request.max_tokens, "detokenize": False,
            "temperature": config.temperature if config.HasField("temperature") else 1.0,
            "top_p": config.top_p if config.HasField("top_p") else 1.0,
        }
        if config.HasField("top_k"):
            kwargs["top_k"] = config.top_k
        if config.HasField("seed"):
            kwargs["seed"] = config.seed
        if request.stop_token_ids:
            kwargs["stop_token_ids"] = list(request.stop_token_ids)
        if request.ignore_eos:
            kwargs["ignore_eos"] = True
        return SamplingParams(**kwargs)

    # -- servicer.py ----------------------------------------------------------------------------

    async def Generate(self, request: pb2.GenerateRequest,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[pb2.GenerateResponse]:
        request_id = request.request_id
        try:
            if not request.HasField("tokenized"):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Missing tokenized input")
            prompt = list(request.tokenized.input_token_ids)
            params = self.sampling_params(request)
            self.state.params.append(params)
            self.state.requests.append(request)
            sent = 0
            async for result in self._manager_generate(request_id, prompt, params):
                cached = getattr(result, "cached_tokens", 0)
                completion = result.outputs[0]
                if request.streaming and len(completion.token_ids) > sent:
                    yield pb2.GenerateResponse(request_id=request_id, chunk=pb2.GenerateStreamChunk(
                        token_ids=completion.token_ids[sent:], prompt_tokens=len(prompt),
                        completion_tokens=len(completion.token_ids), cached_tokens=cached))
                    sent = len(completion.token_ids)
                if result.finished:
                    yield pb2.GenerateResponse(request_id=request_id, complete=pb2.GenerateComplete(
                        output_token_ids=completion.token_ids, finish_reason=completion.finish_reason or "",
                        prompt_tokens=len(prompt), completion_tokens=len(completion.token_ids),
                        cached_tokens=cached))
        except asyncio.CancelledError:
            await self._manager_abort(request_id)
            raise
        except grpc.aio.AbortError:
            raise
        except ValueError as exc:
            await self._manager_abort(request_id)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception as exc:
            await self._manager_abort(request_id)
            await context.abort(grpc.StatusCode.INTERNAL, str(exc))

    async def HealthCheck(self, request: pb2.HealthCheckRequest,
                          context: grpc.aio.ServicerContext) -> pb2.HealthCheckResponse:
        return pb2.HealthCheckResponse(status="OK")

    async def Abort(self, request: pb2.AbortRequest,
                    context: grpc.aio.ServicerContext) -> pb2.AbortResponse:
        ok = await self._manager_abort(request.request_id)
        return pb2.AbortResponse(success=ok,
                                 message=f"Request {request.request_id} {'aborted' if ok else 'not found'}")

    async def GetModelInfo(self, request: pb2.GetModelInfoRequest,
                           context: grpc.aio.ServicerContext) -> pb2.GetModelInfoResponse:
        args = self.llm.args
        return pb2.GetModelInfoResponse(model_id=str(args.model), max_input_len=getattr(args, "max_input_len", 0) or 0,
                                        max_seq_len=getattr(args, "max_seq_len", 0) or 0)

    async def SubscribeKvEvents(self, request: common_pb2.SubscribeKvEventsRequest,
                                context: grpc.aio.ServicerContext) -> AsyncIterator[common_pb2.KvEventBatch]:
        if not self._with_subscription:  # the generated base class: what releases without the method answer
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        self.state.subscriptions += 1
        config = self.llm.args.kv_cache_config
        if not config.enable_block_reuse or config.event_buffer_max_size <= 0:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "KV cache events are not enabled")
        await context.send_initial_metadata(())
        if self._fail_subscriptions > 0:  # a dropped stream (server restart, proxy): the client resubscribes
            self._fail_subscriptions -= 1
            await asyncio.sleep(0.05)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "subscription dropped")
        seq = 0
        while not context.cancelled():
            with contextlib.suppress(TimeoutError, asyncio.QueueEmpty):
                async for event in self.llm.get_kv_cache_events_async(timeout=0):
                    proto = convert_event(event)
                    if proto is None:
                        continue
                    batch = common_pb2.KvEventBatch(sequence_number=seq, events=[proto])
                    if event.get("attention_dp_rank") is not None:
                        batch.dp_rank = event["attention_dp_rank"]
                    seq += 1
                    yield batch
            await asyncio.sleep(0.002)


async def start_fake_server(model: ModelDir, *, num_blocks: int = 512, block_size: int = 32,
                            single_window: bool = True, with_subscription: bool = True,
                            event_buffer_max_size: int = 1024, fail_subscriptions: int = 0,
                            **llm_knobs: Any) -> FakeTrtllmServer:
    """A fake ``trtllm-serve --grpc`` on a free loopback port, its LLM configured as docs/gpu.md starts it."""
    llm_class = SingleWindowLLM if single_window else FakeLLM
    eos = model.eos_token_ids[0] if model.eos_token_ids else 2
    llm = llm_class(FillerVocabulary(model.tokenizer).words, model=str(model.path), num_blocks=num_blocks,
                    kv_cache_config=KvCacheConfig(event_buffer_max_size=event_buffer_max_size,
                                                  tokens_per_block=block_size),
                    enable_chunked_prefill=True, enable_iter_perf_stats=True, eos_token_id=eos, **llm_knobs)
    server = grpc.aio.server()
    state = FakeTrtllmServer(llm, server, 0)
    pb2_grpc.add_TrtllmServiceServicer_to_server(
        FakeTrtllmServicer(state, with_subscription=with_subscription, fail_subscriptions=fail_subscriptions), server)
    state.port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return state
