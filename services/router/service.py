"""The router's gRPC servicer: ``Router.Generate`` runs :class:`~services.router.proxy.Proxy` over gRPC
worker streams; ``Router.ListWorkers`` lists the registry.

The decisions (admission, placement, retry, migration, stall) are the proxy's; this adapter converts the
request and frames and maps the proxy's errors: a status before the first frame, an in-band error after it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from services.api import router_pb2, router_pb2_grpc, worker_pb2
from services.common import errors
from services.common.prompt_reuse import PromptStore
from services.router import convert
from services.router.proxy import Proxy
from services.router.registry import WorkerRegistry
from services.router.worker_client import GrpcWorkerStreams, WorkerChannels


class RouterServicer(router_pb2_grpc.RouterServicer):
    """Router.Generate and Router.ListWorkers (see module docstring)."""

    def __init__(self, proxy: Proxy, channels: WorkerChannels, registry: WorkerRegistry,
                 prompts: PromptStore | None = None) -> None:
        self._proxy = proxy
        self._channels = channels
        self._registry = registry
        self.prompts = prompts or PromptStore()  # prompts parse sent, for its next turn's prompt tail

    async def Generate(
        self,
        request: worker_pb2.GenerateRequest,
        context: grpc.aio.ServicerContext[worker_pb2.GenerateRequest, worker_pb2.GenerateResponse],
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        sent = False
        try:
            prompt = self.prompts.resolve(request)
            async for frame in self._proxy.run(convert.proxy_request(request, prompt),
                                               GrpcWorkerStreams(self._channels, request)):
                sent = True
                yield convert.generate_response(frame)
        except errors.MeshError as err:
            if not sent:
                await errors.abort_with(context, err)
                return
            yield worker_pb2.GenerateResponse(error=errors.to_proto(err))

    async def ListWorkers(
        self,
        request: router_pb2.ListWorkersRequest,
        context: grpc.aio.ServicerContext[router_pb2.ListWorkersRequest, router_pb2.ListWorkersResponse],
    ) -> router_pb2.ListWorkersResponse:
        return router_pb2.ListWorkersResponse(
            workers=[convert.worker_info(ep) for ep in self._registry.endpoints()]
        )
