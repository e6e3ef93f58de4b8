"""The ``trtllm.TrtllmService`` client: the only module of this engine that touches gRPC and ``_pb2``.

Speaks the vendored schema (``proto/third_party/trtllm``, generated as ``services.api.trtllm_service_pb2``)
and hands the engine plain values: :class:`GenerateParams` in, :class:`Delta` out, KV events as the dicts
TensorRT-LLM's ``KVCacheEventSerializer`` writes, so the embedded adapter's translator reads them unchanged.

What the wire loses, as ``tensorrt_llm/grpc/kv_events.py`` converts events: ``created`` and ``updated``
events are not sent (so neither the pool size nor the initial window announcements arrive) and
``window_size`` is dropped (only ``attention_dp_rank`` survives as ``dp_rank``). Block hashes arrive as
signed int64 (``to_int64``); they are opaque ids to the translator, which hashes token ids itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from services.api import smg_common_pb2 as common_pb2
from services.api import trtllm_service_pb2 as pb2
from services.api import trtllm_service_pb2_grpc as pb2_grpc
from services.common.errors import InternalError, UnavailableError, from_rpc_error

_MAX_MESSAGE = 32 * 1024 * 1024  # tensorrt_llm/grpc/smg/server.py, _MAX_MESSAGE_LENGTH_BYTES


@dataclass(frozen=True)
class GenerateParams:
    """One Generate call, in TensorRT-LLM's conventions (``sampling_kwargs`` validated them)."""

    request_id: str
    token_ids: list[int]
    max_tokens: int
    stop_token_ids: list[int]
    ignore_eos: bool
    temperature: float              # sent always: the server's default is 1.0, ours greedy
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None


@dataclass(frozen=True)
class Delta:
    """What one response frame adds: new token ids, the server's cached-prompt figure, and the finish reason
    (``None`` until the ``complete`` frame)."""

    token_ids: list[int]
    cached_tokens: int
    finish_reason: str | None = None


@dataclass(frozen=True)
class ServerModel:
    """``GetModelInfo``: what the server reports (0 where it does not know)."""

    model_id: str
    max_input_len: int
    max_seq_len: int
    vocab_size: int


class KvEventsUnavailable(Exception):
    """The server does not stream KV events (``SubscribeKvEvents`` answered ``UNIMPLEMENTED``)."""


def request_message(params: GenerateParams) -> pb2.GenerateRequest:
    """The ``GenerateRequest`` for ``params``: streaming, token ids only, output without the prompt."""
    sampling = pb2.SamplingConfig(beam_width=1, num_return_sequences=1, temperature=params.temperature)
    if params.top_p is not None:
        sampling.top_p = params.top_p
    if params.top_k is not None:
        sampling.top_k = params.top_k
    if params.seed is not None:
        sampling.seed = params.seed
    return pb2.GenerateRequest(
        request_id=params.request_id,
        tokenized=pb2.TokenizedInput(input_token_ids=params.token_ids),
        sampling_config=sampling,
        output_config=pb2.OutputConfig(exclude_input_from_output=True),
        max_tokens=params.max_tokens,
        streaming=True,
        stop_token_ids=params.stop_token_ids,
        ignore_eos=params.ignore_eos,
    )


def event_dicts(batch: common_pb2.KvEventBatch) -> list[dict[str, Any]]:
    """A ``KvEventBatch`` as ``KVCacheEventSerializer`` dicts (no ``window_size``: the wire has none)."""
    out: list[dict[str, Any]] = []
    for event in batch.events:
        kind = event.WhichOneof("data")
        base: dict[str, Any] = {"event_id": event.event_id}
        if batch.HasField("dp_rank"):
            base["attention_dp_rank"] = batch.dp_rank
        if kind == "stored":
            parent = event.stored.parent_block_hash if event.stored.HasField("parent_block_hash") else None
            blocks = [{"type": "stored_block", "block_hash": b.block_hash,
                       "tokens": [{"type": "unique_token", "token_id": t} for t in b.token_ids]}
                      for b in event.stored.blocks]
            out.append({**base, "data": {"type": "stored", "parent_hash": parent, "blocks": blocks}})
        elif kind == "removed":
            out.append({**base, "data": {"type": "removed", "block_hashes": list(event.removed.block_hashes)}})
        elif kind == "cleared":
            # TensorRT-LLM has no "cleared" event; a rebuilt pool announces itself with "created" again.
            out.append({**base, "data": {"type": "created", "num_blocks_per_cache_level": []}})
    return out


class TrtllmGrpcClient:
    """A channel to one ``trtllm-serve --grpc`` server (insecure: the server binds no TLS port)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._channel = grpc.aio.insecure_channel(target, options=[
            ("grpc.max_send_message_length", _MAX_MESSAGE), ("grpc.max_receive_message_length", _MAX_MESSAGE)])
        self._stub = pb2_grpc.TrtllmServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def health(self, timeout: float = 5.0) -> str:
        """``HealthCheck``'s status ("OK" when healthy); :class:`UnavailableError` when unreachable."""
        try:
            reply = await self._stub.HealthCheck(pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise UnavailableError(f"trtllm-serve at {self.target}: {exc.code().name} {exc.details()}") from exc
        return str(reply.status)

    async def model_info(self) -> ServerModel:
        try:
            reply = await self._stub.GetModelInfo(pb2.GetModelInfoRequest(), timeout=10)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from exc
        return ServerModel(reply.model_id, reply.max_input_len, reply.max_seq_len, reply.vocab_size)

    async def abort(self, request_id: str) -> bool:
        """``Abort``: whether the server still had the request."""
        try:
            reply = await self._stub.Abort(pb2.AbortRequest(request_id=request_id), timeout=10)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from exc
        return bool(reply.success)

    async def generate(self, params: GenerateParams) -> AsyncGenerator[Delta, None]:
        """Stream ``Generate``; closing the generator cancels the call (the server then aborts the request).

        Errors arrive as gRPC status (``INVALID_ARGUMENT`` for what ``SamplingParams`` refuses, ``INTERNAL``
        otherwise) and become our errors. A frame with neither ``chunk`` nor ``complete`` is a release that
        still sends the removed ``GenerateError`` (field 4): an internal error.
        """
        call = self._stub.Generate(request_message(params))
        seen = 0
        try:
            async for reply in call:
                kind = reply.WhichOneof("response")
                if kind == "chunk":
                    seen += len(reply.chunk.token_ids)
                    yield Delta(list(reply.chunk.token_ids), reply.chunk.cached_tokens)
                elif kind == "complete":
                    done = reply.complete
                    rest = list(done.output_token_ids[seen:])  # nothing when every chunk arrived
                    yield Delta(rest, done.cached_tokens, done.finish_reason or "stop")
                    return
                else:
                    raise InternalError(f"trtllm-serve sent an error frame for {params.request_id!r} (an older "
                                        "release's GenerateError); see the server's log")
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from exc
        finally:
            call.cancel()

    async def subscribe_kv_events(self) -> AsyncIterator[list[dict[str, Any]]]:
        """``SubscribeKvEvents`` from the current position: each batch as event dicts.

        :class:`KvEventsUnavailable` when the server has no subscription (``UNIMPLEMENTED``: a release
        without it, or one started without ``event_buffer_max_size`` / block reuse); other failures raise
        our errors and the caller subscribes again.
        """
        call = self._stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(start_sequence_number=0))
        try:
            async for batch in call:
                yield event_dicts(batch)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise KvEventsUnavailable(exc.details() or "UNIMPLEMENTED") from exc
            raise from_rpc_error(exc) from exc
        finally:
            with contextlib.suppress(Exception):
                call.cancel()
