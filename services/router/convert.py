"""Protobuf <-> router domain objects (the router's only place besides the gRPC adapters that sees ``_pb2``)."""

from __future__ import annotations

from services.api import common_pb2, kv_pb2, worker_pb2
from services.common import errors
from services.router.index import ClearedEvent, KvEvent, RemovedEvent, StoredEvent
from services.router.registry import WorkerEndpoint
from services.router.stream import AttemptRequest, Frame, PromptInfo, ProxyRequest, Usage

# FinishReason numbers <-> the domain's names ("stop", "length", ...); 0 (unspecified) is "" (not finished).
_FINISH_NAMES: dict[int, str] = {
    number: name.removeprefix("FINISH_REASON_").lower()
    for name, number in common_pb2.FinishReason.items() if number
}
_FINISH_NUMBERS: dict[str, common_pb2.FinishReason.ValueType] = {
    name: common_pb2.FinishReason.ValueType(number) for number, name in _FINISH_NAMES.items()
}


def kv_events(batch: kv_pb2.KvEventBatch) -> list[KvEvent]:
    out: list[KvEvent] = []
    for event in batch.events:
        kind = event.WhichOneof("event")
        if kind == "stored":
            stored = event.stored
            hashes = tuple(stored.block_hashes) or tuple(b.block_hash for b in stored.blocks)  # (older workers)
            out.append(StoredEvent(event.event_id, hashes,
                                   parent=stored.parent_hash if stored.has_parent else None, chained=True))
        elif kind == "removed":
            out.append(RemovedEvent(event.event_id, tuple(event.removed.block_hashes)))
        elif kind == "cleared":
            out.append(ClearedEvent(event.event_id))
    return out


def endpoint(info: worker_pb2.WorkerInfo) -> WorkerEndpoint:
    return WorkerEndpoint(
        worker_id=info.worker_id,
        address=info.grpc_address,
        block_size=info.block_size,
        total_blocks=info.total_blocks,
        model=info.model,
        engine=info.engine,
        shortest_prefill_first=info.shortest_prefill_first,
    )


def worker_info(ep: WorkerEndpoint) -> worker_pb2.WorkerInfo:
    return worker_pb2.WorkerInfo(
        worker_id=ep.worker_id,
        grpc_address=ep.address,
        block_size=ep.block_size,
        total_blocks=ep.total_blocks,
        model=ep.model,
        engine=ep.engine,
        shortest_prefill_first=ep.shortest_prefill_first,
    )


def proxy_request(request: worker_pb2.GenerateRequest, prompt: bytes) -> ProxyRequest:
    """The router's view of ``request``, whose prompt (packed ids) is ``prompt`` (``PromptStore.resolve``)."""
    return ProxyRequest(
        request_id=request.request_id,
        tokens=prompt,
        max_tokens=request.sampling.max_tokens,
        osl=request.hints.osl,
        priority=request.hints.priority,
        cache_salt=request.cache_salt,
        target_worker_id=request.target_worker_id,
        prefill_only=request.prefill_only,
        continued=request.continued_tokens,
        session=session_key(request.identity),
    )


def session_key(identity: common_pb2.Identity) -> str:
    """Whose turn a request is, for the session footprints: session and trajectory (a sub-agent has its own);
    "" for a request whose client named no session."""
    if identity.anonymous or not identity.session_id:
        return ""
    return f"{identity.session_id}/{identity.trajectory_id}" if identity.trajectory_id else identity.session_id


def worker_request(request: worker_pb2.GenerateRequest, attempt: AttemptRequest) -> worker_pb2.GenerateRequest:
    """The client's request as one attempt runs it (fields the router does not read travel unchanged), less
    its prompt: ``attempt.tokens`` goes with the stream (``ReusingStub.Generate``)."""
    out = worker_pb2.GenerateRequest()
    out.CopyFrom(request)
    out.ClearField("token_ids_u32")
    # Assigned only when changed: an unset sub-message stays unset.
    if attempt.max_tokens != out.sampling.max_tokens:
        out.sampling.max_tokens = attempt.max_tokens
    if attempt.osl != out.hints.osl:
        out.hints.osl = attempt.osl
    out.continued_tokens = attempt.continued
    out.ClearField("target_worker_id")
    out.prefill_only = False
    return out


def frame(response: worker_pb2.GenerateResponse) -> Frame:
    """A worker's frame as a domain value; a plain token frame keeps the message for :func:`generate_response`."""
    if not (response.finish_reason or response.HasField("prompt") or response.HasField("usage")
            or response.HasField("error") or response.stop_string):
        return Frame(token_ids=tuple(response.token_ids), wire=response)
    prompt = response.prompt if response.HasField("prompt") else None
    usage = response.usage if response.HasField("usage") else None
    return Frame(
        token_ids=tuple(response.token_ids),
        prompt=None if prompt is None else PromptInfo(prompt.prompt_tokens, prompt.cached_tokens, prompt.worker_id),
        finish_reason=_finish_name(response.finish_reason),
        usage=None if usage is None else Usage(
            usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens, usage.reasoning_tokens),
        error=errors.from_proto(response.error) if response.HasField("error") else None,
        stop_string=response.stop_string,
    )


def generate_response(frame: Frame) -> worker_pb2.GenerateResponse:
    """A frame for the router's client (a worker's plain token frame passed on as it came)."""
    if isinstance(frame.wire, worker_pb2.GenerateResponse):
        return frame.wire
    out = worker_pb2.GenerateResponse(
        token_ids=frame.token_ids, finish_reason=_finish_number(frame.finish_reason), stop_string=frame.stop_string)
    if frame.prompt is not None:
        p = frame.prompt
        out.prompt.CopyFrom(worker_pb2.PromptInfo(
            prompt_tokens=p.prompt_tokens, cached_tokens=p.cached_tokens, worker_id=p.worker_id))
    if frame.usage is not None:
        u = frame.usage
        out.usage.CopyFrom(common_pb2.Usage(prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
                                            cached_tokens=u.cached_tokens, reasoning_tokens=u.reasoning_tokens))
    if frame.error is not None:
        out.error.CopyFrom(errors.to_proto(frame.error))
    return out


def _finish_name(number: int) -> str:
    # A number this proto does not name (a newer worker's) keeps its number as its name.
    return _FINISH_NAMES.get(number, str(number)) if number else ""


def _finish_number(name: str) -> common_pb2.FinishReason.ValueType:
    if not name:
        return common_pb2.FINISH_REASON_UNSPECIFIED
    return _FINISH_NUMBERS.get(name) or common_pb2.FinishReason.ValueType(int(name))
