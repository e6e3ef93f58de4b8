"""Composition root of the parse service: model format, router channel, servicer, gRPC server."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog

from services.api import chat_pb2, parse_pb2_grpc
from services.common import message_reuse
from services.common.grpc_util import GrpcServer
from services.common.jetstream import BucketConfig, ChunkedKv, bucket_name, chunk_size_for, open_bucket
from services.common.metrics import MetricsServer, serve_metrics
from services.common.model_dir import load_model_dir
from services.common.mux import MuxMethod, method_name
from services.common.nats_util import close_nats, connect_nats
from services.common.prompt_reuse import ReusingStub
from services.common.tracing import Tracing
from services.parse.metrics import ParseMetrics
from services.parse.model_format import ModelFormat
from services.parse.prefix_state import JetStreamPrefixState, LocalPrefixState, PrefixState
from services.parse.renderer import Clock
from services.parse.router_pool import RouterPool
from services.parse.service import ParseService
from services.parse.settings import ParseSettings, chosen_parser
from services.parse.template_catalog import template_policy
from services.parse.tool_prompts import ToolPrompt, suggested_tool_prompt

log = structlog.get_logger()


@dataclass
class RunningParse:
    """A started parse server (``address`` is host:port) and what it owns."""

    server: GrpcServer
    routers: RouterPool  # the router replicas' channels
    model_format: ModelFormat
    metrics_server: MetricsServer | None = None
    nats: Any = None  # the connection of --prefix-watch-store jetstream
    servicer: ParseService | None = None

    @property
    def address(self) -> str:
        return self.server.address

    async def stop(self, grace: float = 2.0) -> None:
        await self.server.stop(grace)
        await self.routers.close()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        if self.nats is not None:
            await close_nats(self.nats)


def build_model_format(settings: ParseSettings) -> ModelFormat:
    """Load the model directory and parsers (the flags', else the directory's ``harnessmesh.json``); unknown
    parser names or a bad template fail here. The template's forms (``template_forms.py``) are decided here, and
    logged: one line, and a warning for unrendered tools."""
    model = load_model_dir(settings.model)
    served_model_name = settings.served_model_name or model.serving.served_model_name
    policy = template_policy(settings.template_policy(), settings.model_catalog, served_model_name or model.name)
    fmt = ModelFormat(
        model,
        served_model_name=served_model_name,
        max_model_len=settings.max_model_len,
        reasoning_parser=chosen_parser(settings.reasoning_parser, model.serving.reasoning_parser),
        tool_parser=chosen_parser(settings.tool_parser, model.serving.tool_parser),
        strip_billing_header=settings.strip_billing_header,
        reasoning_replay=settings.reasoning_replay,
        now=_fixed_clock(settings.template_clock()),
        render_budget=settings.render_budget_ms / 1000 if settings.render_budget_ms else None,
        inline_system=policy.inline_system,
        inline_system_source=policy.inline_system_source,
        tool_prompt=ToolPrompt.load(policy.tool_prompt_template) if policy.tool_prompt_template else None,
        refuse_unrendered_tools=policy.unrendered_tools == "refuse",
    )
    log_template_forms(fmt)
    return fmt


def log_template_forms(fmt: ModelFormat) -> None:
    """The start-up line of the template's forms, and one warning when the request's tools would reach the model
    nowhere (the remedy in it)."""
    forms = fmt.forms
    log.info("parse.template_forms", model=fmt.served_model_name, **forms.summary(), tools_reason=forms.tools_reason)
    if forms.tools_unrendered:
        suggested = suggested_tool_prompt(fmt.model_dir.chat_template)
        remedy = (f"--tool-prompt-template {suggested} (or the catalog key tool_prompt_template)" if suggested
                  else "a tool-prompt template (--tool-prompt-template FILE, or the catalog key tool_prompt_template)")
        log.warning("parse.tools_not_rendered", model=fmt.served_model_name,
                    refused=forms.refuse_unrendered_tools,
                    message=f"the chat template does not render tools: requests with tools are "
                            f"{'refused (400)' if forms.refuse_unrendered_tools else 'served without them'}; "
                            f"to show them to the model set {remedy}")


async def open_prefix_state(settings: ParseSettings) -> tuple[PrefixState, Any]:
    """The prefix-watch state ``settings.prefix_watch_store`` names, and its NATS connection (None in memory)."""
    if settings.prefix_watch_store == "memory":
        return LocalPrefixState(), None
    nc = await connect_nats(settings.nats_url, "harnessmesh-parse", token=settings.nats_token, tls=settings.tls())
    try:
        kv = await open_bucket(nc.jetstream(), BucketConfig(
            bucket_name(settings.prefix_watch_bucket, settings.namespace, "prefix_watch"), settings.prefix_watch_ttl,
            settings.prefix_watch_max_bytes, replicas=settings.prefix_watch_replicas))
    except BaseException:
        await close_nats(nc)
        raise
    # the index (a version) is read every turn: keep it small, histories always go in chunks
    return JetStreamPrefixState(ChunkedKv(kv, chunk_size=chunk_size_for(nc), inline_max=256),
                                connected=lambda: bool(nc.is_connected)), nc


def _fixed_clock(at: datetime | None) -> Clock | None:
    return None if at is None else (lambda: at)


async def start(
    settings: ParseSettings, tracing: Tracing | None = None, model_format: ModelFormat | None = None
) -> RunningParse:
    """Build and start a parse server (in-process use: tests, embedding); ``stop()`` it when done."""
    fmt = model_format or build_model_format(settings)
    routers = RouterPool(settings.router_addresses(), tls=settings.tls(), tracing=tracing,
                         refresh=settings.router_dns_refresh)
    await routers.start()
    tracer = tracing.tracer if tracing is not None else None
    prefix_state, nats = await open_prefix_state(settings)
    metrics = ParseMetrics()
    router = ReusingStub(routers.replicas, retry_unavailable=settings.router_retry)
    servicer = ParseService(fmt, router, tracer, metrics=metrics, limits=settings.request_limits(),
                            router_info=routers.info,
                            prefix_state=prefix_state)
    message_reuse.watch(metrics.registry, servicer.messages)
    server = GrpcServer(tracing, settings.host, settings.port, settings.tls())
    parse_pb2_grpc.add_ParseServicer_to_server(servicer, server.server)
    server.add_mux({method_name("Parse", "Chat"): MuxMethod(servicer.Chat, chat_pb2.ChatRequest)},
                   linger=settings.stream_linger())
    await server.start()
    return RunningParse(server=server, routers=routers, model_format=fmt,
                        metrics_server=serve_metrics(metrics.registry, settings.host, settings.metrics_port),
                        nats=nats, servicer=servicer)


async def serve(settings: ParseSettings, stop: asyncio.Event) -> None:
    """Run the parse service until ``stop`` is set."""
    tracing = Tracing("harnessmesh-parse")
    try:
        running = await start(settings, tracing)
        fmt = running.model_format
        log.info("parse.listening", address=running.address, port=running.server.port,
                 model=str(fmt.model_dir.path), served_model_name=fmt.served_model_name,
                 max_model_len=fmt.max_model_len, router_address=settings.router_address)
        try:
            await stop.wait()
        finally:
            await running.stop()
    finally:
        tracing.shutdown()
