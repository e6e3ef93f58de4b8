"""``harnessmesh health SERVICE``: is one process of a running mesh ready? Exit 0 if so, 1 if not.

Each check asks what the process itself exposes for readiness, and prints one line saying what it saw:

- ``gateway --url URL``: ``GET URL/ready`` answers 200 (the gateway asks parse, parse asks the router for
  routable workers: a ready gateway can serve a turn end to end);
- ``parse --target HOST:PORT``: the parse service's ``Ready`` RPC (the router answers and lists a worker);
- ``router --target HOST:PORT``: gRPC health SERVING and ``ListWorkers`` answers (``--min-workers N``
  to require N routable workers);
- ``worker --target HOST:PORT``: gRPC health SERVING and ``Info`` answers (its id, engine, KV capacity);
- ``nats --url URL``: a NATS connection with the mesh's token (``HARNESSMESH_NATS_TOKEN``) and a round trip.

gRPC and NATS checks use mutual TLS when the ``HARNESSMESH_TLS_*`` files are set, as the services do.
compose.yaml's healthchecks and the image's ``HEALTHCHECK`` run this command; the settings live here
rather than in ``settings.py`` so that a healthcheck, run every few seconds, imports nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from services.common.settings import add_arguments, option, settings_from_namespace
from services.common.tls import TlsFiles

SERVICES = ("gateway", "parse", "router", "worker", "nats")
DEFAULT_URLS = {"gateway": "http://127.0.0.1:8000", "nats": "nats://127.0.0.1:4222"}
HEALTHY, UNHEALTHY, USAGE = 0, 1, 2
REASON_CHARS = 300  # a reason longer than this is cut: the line must stay one readable line


@dataclass(frozen=True)
class HealthSettings:
    """Where the process to check is, how long to wait, and the credentials the mesh's links need."""

    url: str = option("", "gateway: its HTTP URL (default http://127.0.0.1:8000); nats: the NATS URL "
                      "(default nats://127.0.0.1:4222).")
    target: str = option("", "parse, router, worker: the gRPC address HOST:PORT of the process (required).")
    timeout: float = option(3.0, "Seconds the whole check may take before it counts as unhealthy.")
    min_workers: int = option(0, "router: routable workers it must list to count as healthy.")
    nats_token: str = option("", "nats: the token the NATS server requires.", shared=True, secret=True)
    tls_cert: str = option("", "PEM certificate for mutual TLS on gRPC and NATS (as the services' --tls-cert).",
                           shared=True, metavar="FILE")
    tls_key: str = option("", "PEM private key of --tls-cert.", shared=True, metavar="FILE")
    tls_ca: str = option("", "PEM CA certificate that signs every mesh certificate.", shared=True, metavar="FILE")

    def tls(self) -> TlsFiles:
        return TlsFiles(self.tls_cert, self.tls_key, self.tls_ca)


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check: healthy or not, and the one line that says why."""

    healthy: bool
    detail: str


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``health`` on the ``harnessmesh`` subcommands."""
    parser = commands.add_parser("health", help="check that one process of a running mesh is ready (exit 0/1)",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("service", choices=SERVICES)
    add_arguments(parser, HealthSettings, "health", os.environ)


def _one_line(text: str) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= REASON_CHARS else line[:REASON_CHARS - 3] + "..."


def check_gateway(url: str, timeout: float) -> Verdict:
    """``GET {url}/ready``: 200 with the model and worker count, or the gateway's own error message."""
    ready = url.rstrip("/").removesuffix("/v1") + "/ready"
    try:
        with urllib.request.urlopen(ready, timeout=timeout) as reply:
            body = json.load(reply)
        return Verdict(True, f"ready: model {body.get('model')!r}, {body.get('workers')} workers")
    except urllib.error.HTTPError as exc:
        return Verdict(False, f"{ready} answered {exc.code}: {_error_message(exc.read())}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return Verdict(False, f"cannot reach {ready}: {reason}")


def _error_message(body: bytes) -> str:
    """The message of any of the gateway's error shapes (OpenAI's, Anthropic's), else the raw body."""
    try:
        data = json.loads(body)
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
    except ValueError:
        pass
    return body.decode(errors="replace") or "(empty body)"


async def _serving(channel: Any, timeout: float) -> str | None:
    """None when the gRPC health service says SERVING, else why not."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                                 timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        return _rpc_error(exc)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return f"gRPC health is {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
    return None


def _rpc_error(exc: Any) -> str:
    return f"{exc.code().name}: {exc.details()}"


async def check_parse(channel: Any, timeout: float, settings: HealthSettings) -> Verdict:
    """The parse service's ``Ready``: its router answers and lists at least one routable worker."""
    import grpc

    from services.api import parse_pb2, parse_pb2_grpc

    try:
        reply = await parse_pb2_grpc.ParseStub(channel).Ready(parse_pb2.ReadyRequest(), timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        return Verdict(False, f"Ready failed: {_rpc_error(exc)}")
    if not reply.ready:
        return Verdict(False, f"not ready: {reply.reason}")
    return Verdict(True, f"ready: {reply.workers} routable workers")


async def check_router(channel: Any, timeout: float, settings: HealthSettings) -> Verdict:
    """gRPC health SERVING and ``ListWorkers`` answering with at least ``--min-workers`` workers."""
    import grpc

    from services.api import router_pb2, router_pb2_grpc

    if (why := await _serving(channel, timeout)) is not None:
        return Verdict(False, why)
    try:
        reply = await router_pb2_grpc.RouterStub(channel).ListWorkers(router_pb2.ListWorkersRequest(),
                                                                      timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        return Verdict(False, f"ListWorkers failed: {_rpc_error(exc)}")
    count = len(reply.workers)
    if count < settings.min_workers:
        return Verdict(False, f"serving, but lists {count} workers (--min-workers {settings.min_workers})")
    return Verdict(True, f"serving, {count} routable workers")


async def check_worker(channel: Any, timeout: float, settings: HealthSettings) -> Verdict:
    """gRPC health SERVING and ``Info`` answering: the worker's id, engine and KV capacity."""
    import grpc

    from services.api import worker_pb2, worker_pb2_grpc

    if (why := await _serving(channel, timeout)) is not None:
        return Verdict(False, why)
    try:
        info = await worker_pb2_grpc.WorkerStub(channel).Info(worker_pb2.WorkerInfoRequest(), timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        return Verdict(False, f"Info failed: {_rpc_error(exc)}")
    return Verdict(True, f"serving {info.worker_id} ({info.engine}, model {info.model!r}, "
                         f"{info.total_blocks} KV blocks of {info.block_size} tokens)")


GrpcCheck = Callable[[Any, float, HealthSettings], Awaitable[Verdict]]
GRPC_CHECKS: dict[str, GrpcCheck] = {"parse": check_parse, "router": check_router, "worker": check_worker}


async def check_grpc(service: str, settings: HealthSettings) -> Verdict:
    """Run ``service``'s check over one channel to ``--target``."""
    from services.common.grpc_util import open_channel

    channel = open_channel(settings.target, None, settings.tls())
    try:
        return await GRPC_CHECKS[service](channel, settings.timeout, settings)
    finally:
        await channel.close(None)


async def check_nats(url: str, settings: HealthSettings) -> Verdict:
    """Connect with the token (and TLS files), one round trip (flush), close.

    nats-py retries a failed first connect until its own timeout even without reconnects: the first error
    it reports (refused, unauthorized, TLS) ends the check at once instead.
    """
    import nats

    errors: list[BaseException] = []
    failed = asyncio.Event()

    async def on_error(exc: Exception) -> None:  # the error is the verdict; nats-py would print a traceback
        errors.append(exc)
        failed.set()

    tls = settings.tls()
    attempt = asyncio.ensure_future(nats.connect(
        url, token=settings.nats_token or None, tls=tls.client_context() if tls.enabled else None,
        connect_timeout=settings.timeout, allow_reconnect=False, error_cb=on_error, name="harnessmesh-health"))
    failure = asyncio.ensure_future(failed.wait())
    await asyncio.wait([attempt, failure], return_when=asyncio.FIRST_COMPLETED)
    failure.cancel()
    if not attempt.done():  # it reported an error and would retry: stop it
        attempt.cancel()
        with contextlib.suppress(BaseException):
            await attempt
        return Verdict(False, f"cannot connect: {type(errors[0]).__name__}: {errors[0]}")
    if (raised := attempt.exception()) is not None:
        first = errors[0] if errors else raised
        return Verdict(False, f"cannot connect: {type(first).__name__}: {first}")
    nc = attempt.result()
    try:
        await nc.flush(timeout=max(1, round(settings.timeout)))  # nats-py takes whole seconds
        return Verdict(True, f"connected, server {_version(nc.connected_server_version)}")
    except Exception as exc:  # a server that accepted the connection but does not answer
        return Verdict(False, f"no round trip: {type(exc).__name__}: {exc}")
    finally:
        await nc.close()


def _version(version: Any) -> str:
    try:
        return f"{version.major}.{version.minor}.{version.patch}"
    except ValueError:  # not semver: nats-py's own rendering
        return str(version)


async def check(service: str, settings: HealthSettings) -> Verdict:
    """The verdict for ``service``; a check that takes longer than ``--timeout`` is unhealthy."""
    url = settings.url or DEFAULT_URLS.get(service, "")
    try:
        async with asyncio.timeout(settings.timeout + 0.5):  # each call has its own timeout; this is the cap
            if service == "gateway":
                return await asyncio.to_thread(check_gateway, url, settings.timeout)
            if service == "nats":
                return await check_nats(url, settings)
            return await check_grpc(service, settings)
    except TimeoutError:
        return Verdict(False, f"no answer within {settings.timeout:g}s")


def where(service: str, settings: HealthSettings) -> str:
    """The address a check reports on (the URL or target it used)."""
    return settings.target if service in GRPC_CHECKS else settings.url or DEFAULT_URLS[service]


def usage_error(service: str, settings: HealthSettings) -> str | None:
    """Why these options cannot check ``service`` (None: they can)."""
    if service in GRPC_CHECKS:
        if not settings.target:
            return f"health {service} needs --target HOST:PORT (the process's gRPC address)"
        if settings.url:
            return f"health {service} takes --target, not --url"
    elif settings.target:
        return f"health {service} takes --url, not --target"
    if settings.timeout <= 0:
        return "--timeout must be > 0"
    return None


def run(ns: argparse.Namespace) -> int:
    """Print one line (``SERVICE ADDRESS: healthy|unhealthy: ...``); 0 healthy, 1 not, 2 for bad options."""
    settings = settings_from_namespace(HealthSettings, ns)
    service: str = ns.service
    if (problem := usage_error(service, settings)) is not None:
        print(f"harnessmesh health: {problem}")
        return USAGE
    verdict = asyncio.run(check(service, settings))
    state = "healthy" if verdict.healthy else "unhealthy"
    print(f"{service} {where(service, settings)}: {state}: {_one_line(verdict.detail)}", flush=True)
    return HEALTHY if verdict.healthy else UNHEALTHY
