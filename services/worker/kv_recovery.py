"""The worker's ``KvRecovery`` gRPC service: event replay from the publisher's ring buffer, and dumps.

A router that sees a gap in a worker's event ids asks for ``Replay(from)``; if the ring buffer no longer
reaches back that far (``complete=False``) it asks for a ``Dump`` of the whole block set instead. A
router that starts (or restarts) dumps every live worker. Both answer from the :class:`KvPublisher`'s
view (what was published), so they are consistent with the NATS stream whatever the engine.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import grpc

from services.api import kv_pb2, kv_pb2_grpc
from services.worker.kv_publisher import KvPublisher

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


class KvRecoveryServicer(kv_pb2_grpc.KvRecoveryServicer):
    """Serves replay and dump requests from a worker's :class:`KvPublisher`."""

    def __init__(self, worker_id: str, publisher: KvPublisher) -> None:
        self._worker_id = worker_id
        self._publisher = publisher

    async def Replay(self, request: kv_pb2.KvReplayRequest, context: Context) -> kv_pb2.KvReplayResponse:  # type: ignore[override]
        events = self._publisher.replay(request.from_event_id)
        if events is None:
            return kv_pb2.KvReplayResponse(complete=False)
        return kv_pb2.KvReplayResponse(
            complete=True, batch=kv_pb2.KvEventBatch(worker_id=self._worker_id, events=events))

    async def Dump(self, request: kv_pb2.KvDumpRequest, context: Context) -> kv_pb2.KvDump:  # type: ignore[override]
        pub = self._publisher
        blocks = sorted(pub.blocks.items())
        return kv_pb2.KvDump(worker_id=self._worker_id, last_event_id=pub.last_event_id, chained=True,
                             block_hashes=[h for h, _ in blocks], parent_hashes=[p or 0 for _, p in blocks],
                             has_parent=[p is not None for _, p in blocks])
