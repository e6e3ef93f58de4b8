"""Proto <-> domain conversion for the worker. The only worker module besides the adapters that touches _pb2."""

from __future__ import annotations

from collections.abc import Sequence

from services.api import common_pb2, kv_pb2, worker_pb2
from services.common import token_bytes
from services.worker.engine import (
    EngineInfo,
    EngineOutput,
    EngineRequest,
    EngineStats,
    FinishReason,
    KvCleared,
    KvEvent,
    KvRemoved,
    KvStored,
)

_FINISH: dict[FinishReason, common_pb2.FinishReason.ValueType] = {
    "stop": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
    "cancelled": common_pb2.FINISH_REASON_CANCELLED,
}


def request_from_proto(msg: worker_pb2.GenerateRequest, prompt: bytes | None = None) -> EngineRequest:
    """The engine's request for ``msg``, whose prompt (packed ids) is ``prompt`` (``PromptStore.resolve``;
    None: ``msg.token_ids_u32``)."""
    s = msg.sampling
    packed = msg.token_ids_u32 if prompt is None else prompt
    return EngineRequest(
        request_id=msg.request_id,
        token_ids=token_bytes.view(packed),  # read in place: no copy, no int made until one is read
        packed=packed,
        max_tokens=s.max_tokens,
        stop=tuple(s.stop),
        stop_token_ids=tuple(msg.stop_token_ids),
        ignore_eos=s.ignore_eos,
        temperature=s.temperature if s.HasField("temperature") else None,
        top_p=s.top_p if s.HasField("top_p") else None,
        top_k=s.top_k if s.HasField("top_k") else None,
        seed=s.seed if s.HasField("seed") else None,
        match_text=msg.match_text,
        cache_salt=msg.cache_salt,
        priority=msg.hints.priority,
        continued_tokens=msg.continued_tokens,
        retention_hold_s=max(0.0, msg.retention.hold_s, msg.hints.cache_ttl_s),
        retention_first=msg.retention.evict_first,
        retention_tool_call_hold_s=max(0.0, msg.retention.tool_call_hold_s),
        retention_answer_first=msg.retention.answer_evict_first,
    )


def output_to_proto(out: EngineOutput, worker_id: str) -> worker_pb2.GenerateResponse:
    frame = worker_pb2.GenerateResponse(token_ids=out.token_ids)
    if out.prompt is not None:
        frame.prompt.CopyFrom(worker_pb2.PromptInfo(
            prompt_tokens=out.prompt.prompt_tokens, cached_tokens=out.prompt.cached_tokens, worker_id=worker_id))
    if out.finish_reason is not None:
        frame.finish_reason = _FINISH[out.finish_reason]
    if out.usage is not None:
        frame.usage.CopyFrom(common_pb2.Usage(
            prompt_tokens=out.usage.prompt_tokens,
            completion_tokens=out.usage.completion_tokens,
            cached_tokens=out.usage.cached_tokens,
        ))
    if out.stop_string:
        frame.stop_string = out.stop_string
    return frame


def worker_info_to_proto(info: EngineInfo, worker_id: str, grpc_address: str) -> worker_pb2.WorkerInfo:
    return worker_pb2.WorkerInfo(
        worker_id=worker_id,
        grpc_address=grpc_address,
        block_size=info.block_size,
        total_blocks=info.total_blocks,
        model=info.model,
        engine=info.engine,
        shortest_prefill_first=info.shortest_prefill_first,
    )


def heartbeat_to_proto(info: worker_pb2.WorkerInfo, stats: EngineStats, leaving: bool) -> kv_pb2.WorkerHeartbeat:
    return kv_pb2.WorkerHeartbeat(
        info=info, leaving=leaving, active_requests=stats.active_requests, active_blocks=stats.active_blocks)


def event_to_proto(event: KvEvent) -> kv_pb2.KvEvent:
    msg = kv_pb2.KvEvent(event_id=event.event_id)
    if isinstance(event, KvStored):
        hashes, ids, counts = zip(*event.blocks, strict=True) if event.blocks else ((), (), ())
        msg.stored.CopyFrom(kv_pb2.BlocksStored(
            parent_hash=event.parent_hash or 0, has_parent=event.parent_hash is not None,
            block_hashes=hashes, engine_block_ids=ids, token_counts=counts,
        ))
    elif isinstance(event, KvRemoved):
        msg.removed.CopyFrom(kv_pb2.BlocksRemoved(block_hashes=event.block_hashes))
    elif isinstance(event, KvCleared):
        msg.cleared.CopyFrom(kv_pb2.CacheCleared())
    return msg


def events_to_proto(worker_id: str, events: Sequence[KvEvent]) -> kv_pb2.KvEventBatch:
    return kv_pb2.KvEventBatch(worker_id=worker_id, events=[event_to_proto(e) for e in events])
