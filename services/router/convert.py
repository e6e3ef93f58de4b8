"""Protobuf <-> router domain objects."""

from __future__ import annotations

from services.api import kv_pb2, worker_pb2
from services.router.index import ClearedEvent, KvEvent, RemovedEvent, StoredEvent
from services.router.registry import WorkerEndpoint


def kv_events(batch: kv_pb2.KvEventBatch) -> list[KvEvent]:
    out: list[KvEvent] = []
    for event in batch.events:
        kind = event.WhichOneof("event")
        if kind == "stored":
            out.append(StoredEvent(event.event_id, tuple(b.block_hash for b in event.stored.blocks)))
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
    )


def worker_info(ep: WorkerEndpoint) -> worker_pb2.WorkerInfo:
    return worker_pb2.WorkerInfo(
        worker_id=ep.worker_id,
        grpc_address=ep.address,
        block_size=ep.block_size,
        total_blocks=ep.total_blocks,
        model=ep.model,
        engine=ep.engine,
    )
