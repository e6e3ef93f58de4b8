"""Several router replicas behind one Generate stub: the parse service spreads streams over them.

Every replica consumes the same KV events and places on the same workers, so any of them places a
stream as well as another. Each replica has its own mux session (one long-lived bidi stream,
``services/common/mux.py``), so the choice is made here, per stream (gRPC's ``round_robin`` policy
balances calls, and the session is one call: it would pin every stream to one replica):

- a stream with a ``prompt_key`` (a long prompt: a session's turn, see ``services/common/prompt_reuse.py``)
  goes to its key's replica by rendezvous hashing (the highest ``xxh3(key, address)``), so a session's
  turns keep landing on the router that holds their prefix: the prompt-reuse tail is accepted there, and
  the router's own reuse towards the worker and its pending-prefix predictions stay warm. Every parse
  replica computes the same choice from the same addresses, and a replica leaving or joining moves only
  the keys it held or takes;
- any other stream goes round robin.

Only replicas not marked down are chosen. A replica whose stream fails ``UNAVAILABLE`` is marked down
for ``down_for`` seconds; the caller's retry before the first frame
(:class:`~services.common.prompt_reuse.ReusingCall`) or resume after it
(:class:`~services.parse.router_stream.ResumingRouterStream`) then opens the stream on the next replica
in the key's order. With every replica down the first in order is tried (it may be back).
``ListWorkers`` (readiness) asks the replicas in turn and answers with the first that responds.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import xxhash

from services.api import router_pb2, router_pb2_grpc, worker_pb2
from services.common.mux import GenerateStub, rpc_error
from services.common.prompt_reuse import GenerateCall, WrappedCall

DOWN_FOR = 2.0


@dataclass(eq=False)
class Replica:
    """One router replica: its address, its stub, when it is usable again, its streams in flight."""

    address: str
    stub: GenerateStub
    down_until: float = 0.0
    open: int = 0     # streams in flight on it from this process
    streams: int = 0  # streams sent to it in all


class RouterReplicas:
    """``Generate`` over the replicas' mux stubs (see module docstring); :meth:`replace` changes the set."""

    def __init__(self, stubs: Sequence[GenerateStub] | Mapping[str, GenerateStub] = (), *,
                 down_for: float = DOWN_FOR, on_starved: Callable[[], None] | None = None) -> None:
        self.down_for = down_for
        self.replicas: list[Replica] = []
        self._turn = itertools.count()
        self._on_starved = on_starved  # every replica is down, or none is known: the owner may look again
        self.failovers = 0  # streams that went to another replica than their first choice (it was down)
        self.replace(stubs if isinstance(stubs, Mapping) else {s.channel.target: s for s in stubs})

    def replace(self, stubs: Mapping[str, GenerateStub]) -> list[Replica]:
        """Serve from ``stubs`` (address -> stub) from now on; the replicas no longer named are returned
        (their streams in flight go on: close them once ``open`` is 0)."""
        kept = {r.address: r for r in self.replicas}
        self.replicas = [kept.pop(address) if address in kept else Replica(address, stub)
                         for address, stub in stubs.items()]
        return list(kept.values())

    def order(self, key: str) -> list[Replica]:
        """Every replica, in the order a stream with ``key`` tries them."""
        if key:
            return sorted(self.replicas, reverse=True,
                          key=lambda r: xxhash.xxh3_64_intdigest(f"{key}\0{r.address}".encode()))
        n = len(self.replicas)
        turn = next(self._turn)
        return [self.replicas[(turn + i) % n] for i in range(n)]

    def pick(self, key: str = "") -> Replica | None:
        order = self.order(key)
        now = time.monotonic()
        for i, replica in enumerate(order):
            if replica.down_until <= now:
                self.failovers += i > 0
                return replica
        if self._on_starved is not None:
            self._on_starved()
        return order[0] if order else None

    def mark_down(self, replica: Replica) -> None:
        replica.down_until = time.monotonic() + self.down_for

    def Generate(self, request: worker_pb2.GenerateRequest, *, timeout: float | None = None) -> GenerateCall:
        replica = self.pick(request.prompt_key)
        if replica is None:
            return NoReplica()
        return ReplicaCall(self, replica, replica.stub.Generate(request, timeout=timeout))


class ReplicaCall(WrappedCall):
    """One stream on one replica, read like a ``MuxCall``; an ``UNAVAILABLE`` marks its replica down."""

    def __init__(self, replicas: RouterReplicas, replica: Replica, call: GenerateCall) -> None:
        self._replicas = replicas
        self._replica = replica
        self._call = call
        self._open = True
        replica.open += 1
        replica.streams += 1

    async def read(self) -> worker_pb2.GenerateResponse | Any:
        try:
            message = await self._call.read()
        except grpc.aio.AioRpcError as exc:
            self._closed()
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                self._replicas.mark_down(self._replica)
            raise
        if message is grpc.aio.EOF:
            self._closed()
        return message

    def cancel(self) -> bool:
        self._closed()
        return self._call.cancel()

    def _closed(self) -> None:
        if self._open:
            self._open = False
            self._replica.open -= 1


class NoReplica:
    """The stream of a parse service that knows no router address yet (a DNS name with no address): it
    fails ``UNAVAILABLE``, which the caller retries."""

    async def read(self) -> Any:
        raise rpc_error(grpc.StatusCode.UNAVAILABLE, "no router address is known (the DNS name resolved to none)")

    def cancel(self) -> bool:
        return False

    def done(self) -> bool:
        return True


class RouterInfo:
    """The routers' unary ``ListWorkers``, answered by the first replica that responds (readiness)."""

    def __init__(self, stubs: Sequence[router_pb2_grpc.RouterStub]) -> None:
        self.stubs = list(stubs)  # replaced by the owner when the set of replicas changes

    async def ListWorkers(self, request: router_pb2.ListWorkersRequest, *, timeout: float | None = None,
                          ) -> router_pb2.ListWorkersResponse:
        error: grpc.aio.AioRpcError | None = None
        for stub in list(self.stubs):
            try:
                reply: router_pb2.ListWorkersResponse = await stub.ListWorkers(request, timeout=timeout)
                return reply
            except grpc.aio.AioRpcError as exc:
                error = exc
        raise error or rpc_error(grpc.StatusCode.UNAVAILABLE, "no router address is known")
