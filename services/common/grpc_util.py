"""gRPC plumbing shared by every process: servers with health and tracing, traced channels."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common.mux import DEFAULT_LINGER, MuxChannel, MuxMethod, MuxServer, add_mux_server
from services.common.tls import PLAINTEXT, TlsFiles
from services.common.tracing import Tracing

# Generous limits: prompts of 200K tokens travel as one message.
CHANNEL_OPTIONS: Sequence[tuple[str, Any]] = (
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.http2.max_pings_without_data", 0),
)


class GrpcServer:
    """A grpc.aio server with the standard health service and tracing interceptors; over mutual TLS when
    ``tls`` is enabled (``client_auth=False``: TLS without client certificates, the harness edge's)."""

    def __init__(self, tracing: Tracing | None, host: str, port: int, tls: TlsFiles = PLAINTEXT, *,
                 client_auth: bool = True) -> None:
        interceptors = tracing.server_interceptors() if tracing is not None else ()
        self.server = grpc.aio.server(interceptors=interceptors, options=CHANNEL_OPTIONS)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        try:
            if tls.enabled:
                credentials = tls.server_credentials(require_client_auth=client_auth)
                self.port = self.server.add_secure_port(f"{host}:{port}", credentials)
            else:
                self.port = self.server.add_insecure_port(f"{host}:{port}")
        except RuntimeError as exc:  # grpcio raises RuntimeError("Failed to bind ...") for a port in use
            raise OSError(f"cannot bind gRPC server to {host}:{port}: {exc}") from exc
        if self.port == 0:
            raise OSError(f"cannot bind gRPC server to {host}:{port}")
        self.host = host
        self._muxes: list[MuxServer] = []

    def add_mux(self, methods: Mapping[str, MuxMethod], linger: float = DEFAULT_LINGER) -> None:
        """Serve ``methods`` (full name -> handler) on mux sessions too (``services.common.mux``)."""
        self._muxes.append(add_mux_server(self.server, methods, linger))

    @property
    def address(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"{host}:{self.port}"

    async def start(self) -> None:
        await self.server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float = 2.0) -> None:
        """Health NOT_SERVING, then up to ``grace`` s for open streams to end (mux sessions refuse new streams
        meanwhile), then stop: what is still open is cancelled."""
        await self.health.enter_graceful_shutdown()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        for mux in self._muxes:
            await mux.drain(max(0.0, deadline - loop.time()))
        await self.server.stop(max(0.0, deadline - loop.time()))


def open_mux_channel(target: str, tls: TlsFiles = PLAINTEXT) -> MuxChannel:
    """A channel for mux streams to ``target`` (each stream carries its own trace context)."""
    return MuxChannel(target, options=CHANNEL_OPTIONS,
                      credentials=tls.channel_credentials() if tls.enabled else None)


def open_channel(target: str, tracing: Tracing | None, tls: TlsFiles = PLAINTEXT) -> grpc.aio.Channel:
    """A channel whose calls carry the current trace context: plaintext, or mutual TLS with ``tls``."""
    interceptors = tracing.client_interceptors() if tracing is not None else None
    if tls.enabled:
        return grpc.aio.secure_channel(target, tls.channel_credentials(), options=CHANNEL_OPTIONS,
                                       interceptors=interceptors)
    return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS, interceptors=interceptors)


async def drain(call: Any, timeout: float = 1.0, most: int = 4) -> None:
    """Read a stream that already sent its last frame up to EOF (a few reads at most, never raising).

    The tracing interceptor ends a client span only when the response stream is read to its end; a
    call cancelled right after its final frame would leave the span open until garbage collection.
    """
    with contextlib.suppress(Exception):
        for _ in range(most):
            if await asyncio.wait_for(call.read(), timeout) is grpc.aio.EOF:
                return


async def check_health(channel: grpc.aio.Channel, deadline: float = 1.0) -> bool:
    """True when the service behind ``channel`` reports SERVING."""
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=deadline)
    except grpc.aio.AioRpcError:
        return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
