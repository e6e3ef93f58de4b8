"""A stand-in router for the parse service's router-client tests: a real grpc.aio mux server on loopback that
holds prompts as the real router does (a tail whose prefix it lacks is refused FAILED_PRECONDITION), answers
every Generate with its name as the one token id, and lists one worker, ``w<name>``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from services.api import common_pb2, router_pb2, router_pb2_grpc, worker_pb2
from services.common import mux
from services.common.errors import PromptBaseUnknownError
from services.common.grpc_util import GrpcServer
from services.common.prompt_reuse import PromptStore


class Router(router_pb2_grpc.RouterServicer):
    """See the module docstring; ``served`` counts the streams it answered."""

    def __init__(self, name: int) -> None:
        self.name = name
        self.prompts = PromptStore()
        self.served = 0

    async def Generate(self, request: worker_pb2.GenerateRequest, context: Any,  # type: ignore[override]
                       ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        try:
            self.prompts.resolve(request)
        except PromptBaseUnknownError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        self.served += 1
        yield worker_pb2.GenerateResponse(token_ids=[self.name])
        yield worker_pb2.GenerateResponse(finish_reason=common_pb2.FINISH_REASON_LENGTH)

    async def ListWorkers(self, request: router_pb2.ListWorkersRequest, context: Any,  # type: ignore[override]
                          ) -> router_pb2.ListWorkersResponse:
        return router_pb2.ListWorkersResponse(workers=[worker_pb2.WorkerInfo(worker_id=f"w{self.name}")])


async def serve(router: Router, port: int, host: str = "127.0.0.1") -> GrpcServer:
    """``router`` on ``host:port``: its Generate over the mux, its ListWorkers as a plain RPC."""
    server = GrpcServer(None, host, port)
    server.add_mux({mux.method_name("Router", "Generate"): mux.MuxMethod(router.Generate,
                                                                       worker_pb2.GenerateRequest)})
    router_pb2_grpc.add_RouterServicer_to_server(router, server.server)
    await server.start()
    return server
