"""Composition root of the gateway: channel to parse, HTTP app under uvicorn, gRPC edge server."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import structlog
import uvicorn
from starlette.applications import Starlette

from gateway.admission import Admission
from gateway.apis.grpc_edge.service import AgentServicer, add_agent_service
from gateway.app import create_app
from gateway.auth import ApiKeys
from gateway.metrics import GatewayMetrics
from gateway.parse_client import ParseClient
from gateway.settings import GatewaySettings
from gateway.shared_state import GatewayState, open_state
from gateway.trace_records import TraceRecordSink
from gateway.turn_tracking import TurnTracker
from services.common.grpc_util import GrpcServer, open_channel, open_mux_channel
from services.common.metrics import MetricsServer, serve_metrics
from services.common.tracing import Tracing

log = structlog.get_logger()


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handlers: the process's ``stop`` event decides when to exit."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:  # name what was tried: "Address already in use" alone does not say which port
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port} (HTTP): {exc.strerror}") from exc
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def admission_of(settings: GatewaySettings) -> Admission:
    queued = settings.max_queued_requests
    return Admission(settings.max_concurrent_requests, settings.max_concurrent_requests if queued < 0 else queued,
                     settings.max_queue_wait, settings.max_queue_wait_ttfts)


class Gateway:
    """The running gateway: HTTP edge + gRPC edge over one channel to the parse service.

    ``start()`` opens the stores that may be shared with other replicas (``shared_state.py``: memory or NATS
    JetStream), builds the parse client and the app over them, binds both ports (port 0 picks a free one)
    and returns when both serve; ``stop()`` shuts down both and closes the channel and the stores. ``parse``
    and ``app`` exist once started. Tests build it exactly like ``serve``.
    """

    parse: ParseClient
    app: Starlette

    def __init__(self, settings: GatewaySettings, tracing: Tracing | None) -> None:
        self.settings = settings
        self._tracing = tracing
        self._channel = open_channel(settings.parse_address, tracing, settings.tls())
        self._streams = open_mux_channel(settings.parse_address, settings.tls())
        self.metrics = GatewayMetrics()
        self.records = TraceRecordSink(settings.trace_records) if settings.trace_records else None
        self._metrics_server: MetricsServer | None = None
        # the harness edge: TLS when configured, but no client certificate (harnesses use the API key)
        self._grpc = GrpcServer(tracing, settings.host, settings.grpc_port, settings.tls(), client_auth=False)
        self._sock = _bind(settings.host, settings.http_port)
        self.http_port: int = self._sock.getsockname()[1]
        self._http: _Uvicorn | None = None
        self._http_task: asyncio.Task[None] | None = None
        self._state: GatewayState | None = None

    def _build(self, state: GatewayState) -> _Uvicorn:
        """The parse client, the HTTP app and the gRPC edge over the opened ``state``; the HTTP server to run."""
        settings = self.settings
        tracer = self._tracing.tracer if self._tracing is not None else None
        turns = TurnTracker(tracer, self.metrics, self.records, links=state.turn_links)
        self.parse = ParseClient(
            self._channel, timeout=settings.request_timeout, served_model_name=settings.served_model_name,
            aliases=settings.model_aliases(), turns=turns, streams=self._streams, admission=admission_of(settings),
        )
        self.metrics.watch_admission(self.parse.admission)
        self.app = create_app(self.parse, settings, tracer, self.metrics, responses_store=state.responses)
        agent = AgentServicer(self.parse, ApiKeys(settings.api_key))
        add_agent_service(agent, self._grpc.server)  # undecodable requests: INVALID_ARGUMENT, not UNKNOWN
        config = uvicorn.Config(
            self.app,
            http="httptools",  # C parser: half h11's CPU per request (a refusal under overload: 0.36 -> 0.17 ms)
            log_config=None,
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=2,
        )
        return _Uvicorn(config)

    @property
    def http_url(self) -> str:
        host = "127.0.0.1" if self.settings.host in ("0.0.0.0", "::", "") else self.settings.host
        return f"http://{host}:{self.http_port}"

    @property
    def grpc_address(self) -> str:
        return self._grpc.address

    async def start(self) -> None:
        self._state = await open_state(self.settings)  # memory, or NATS JetStream (docs/state.md)
        http = self._http = self._build(self._state)
        self._metrics_server = serve_metrics(self.metrics.registry, self.settings.host, self.settings.metrics_port)
        await self._grpc.start()
        self._http_task = asyncio.create_task(http.serve(sockets=[self._sock]))
        while not http.started:
            if self._http_task.done():
                await self._http_task  # surfaces the start-up failure
                raise RuntimeError("the HTTP server exited during start-up")
            await asyncio.sleep(0.01)
        log.info("gateway.ready", http_url=self.http_url, grpc_address=self.grpc_address,
                 parse_address=self.settings.parse_address)

    async def stop(self) -> None:
        if self._http is not None:
            self._http.should_exit = True
        if self._http_task is not None:
            await self._http_task
        else:
            self._sock.close()
        await self._grpc.stop(grace=1.0)
        await self._channel.close()
        await self._streams.close()
        if self._metrics_server is not None:
            self._metrics_server.stop()
        if self.records is not None:
            self.records.close()
        if self._state is not None:
            await self._state.close()
        log.info("gateway.stopped")


async def serve(settings: GatewaySettings, stop: asyncio.Event) -> None:
    """Run the gateway until ``stop`` is set."""
    tracing = Tracing("harnessmesh-gateway")
    gateway = Gateway(settings, tracing)
    try:
        await gateway.start()
        await stop.wait()
    finally:
        await gateway.stop()
        tracing.shutdown()


__all__ = ["Gateway", "serve"]
