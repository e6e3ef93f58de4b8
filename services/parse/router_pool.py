"""The parse service's router replicas as addresses: ``--router-address`` entries, DNS names among them.

An entry is ``host:port`` (one replica, dialled by that name: gRPC resolves it and reconnects as the
name's address changes) or ``dns:///name:port`` (one replica per address the name resolves to: a
Kubernetes headless Service, a round-robin DNS record). The names are resolved here, not by gRPC:
each replica needs its own mux session (``router_replicas.py``), and gRPC does not let a caller pin a
call to one of a channel's addresses. A ``dns:///`` name is resolved at start, every ``refresh``
seconds, and at once (at most once a second) when every replica is down; an address that disappears
is dropped once its streams in flight end. With TLS a per-address channel still checks the server's
certificate against the name, so the certificate must name it (as gRPC's own ``dns:///`` would).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc
import structlog

from services.api import router_pb2_grpc
from services.common.grpc_util import CHANNEL_OPTIONS
from services.common.mux import GenerateStub, MuxChannel
from services.common.tls import PLAINTEXT, TlsFiles
from services.common.tracing import Tracing
from services.parse.router_replicas import DOWN_FOR, Replica, RouterInfo, RouterReplicas

log = structlog.get_logger()

DNS_SCHEME = "dns:///"
STARVED_EVERY = 1.0     # least seconds between two on-demand resolutions
RETIRED_GRACE = 600.0   # a dropped address's channels are closed by then even with streams left open

Resolver = Callable[[str, int], Awaitable[list[str]]]


@dataclass(frozen=True)
class RouterTarget:
    """One ``--router-address`` entry."""

    host: str
    port: int
    dns: bool  # dns:///: one replica per address the name resolves to

    @classmethod
    def parse(cls, entry: str) -> RouterTarget:
        dns = entry.startswith(DNS_SCHEME)
        host, sep, port = entry.removeprefix(DNS_SCHEME).rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"router address {entry!r} is not host:port or dns:///name:port")
        return cls(host.strip("[]"), int(port), dns)

    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


async def resolve_host(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to, as ``ip:port`` (sorted, no duplicates)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({RouterTarget(str(info[4][0]), port, False).address() for info in infos})


@dataclass
class _Channels:
    mux: MuxChannel
    info: grpc.aio.Channel
    retired_at: float = 0.0


class RouterPool:
    """Channels to every router replica, the :class:`RouterReplicas` and :class:`RouterInfo` over them, kept
    current with the ``dns:///`` names (see module docstring); :meth:`close` when done."""

    def __init__(self, entries: Sequence[str], *, tls: TlsFiles = PLAINTEXT, tracing: Tracing | None = None,
                 resolve: Resolver = resolve_host, refresh: float = 30.0, down_for: float = DOWN_FOR) -> None:
        self.targets = [RouterTarget.parse(entry) for entry in entries]
        if not self.targets:
            raise ValueError("at least one router address is needed")
        self._tls = tls
        self._tracing = tracing
        self._resolve = resolve
        self._refresh = refresh
        self.replicas = RouterReplicas(down_for=down_for, on_starved=self._starved)
        self.info = RouterInfo([])
        self._channels: dict[str, _Channels] = {}
        self._retired: list[tuple[Replica, _Channels]] = []
        self._resolved: dict[RouterTarget, list[str]] = {}
        self._task: asyncio.Task[None] | None = None
        self._lookup: asyncio.Task[None] | None = None
        self._last_lookup = 0.0

    async def start(self) -> None:
        await self.resolve()
        if self._refresh > 0 and any(t.dns for t in self.targets):
            self._task = asyncio.create_task(self._refresh_loop(), name="router-dns-refresh")

    async def resolve(self) -> None:
        """Resolve the ``dns:///`` names now and serve from the addresses found (a failed lookup keeps the
        name's last addresses)."""
        self._last_lookup = time.monotonic()
        wanted: dict[str, str] = {}
        for target in self.targets:
            if not target.dns:
                wanted.setdefault(target.address(), "")
                continue
            try:
                self._resolved[target] = await self._resolve(target.host, target.port)
            except OSError as exc:
                log.warning("parse.router_dns_failed", name=target.host, error=repr(exc),
                            kept=self._resolved.get(target, []))
            for address in self._resolved.get(target, []):
                wanted.setdefault(address, target.host)
        self._apply(wanted)

    def _apply(self, wanted: dict[str, str]) -> None:
        added = [a for a in wanted if a not in self._channels]
        for address in added:
            self._channels[address] = self._open(address, wanted[address])
        gone = self.replicas.replace({a: GenerateStub(self._channels[a].mux, "Router") for a in wanted})
        now = time.monotonic()
        for replica in gone:
            channels = self._channels.pop(replica.address)
            channels.retired_at = now
            self._retired.append((replica, channels))
        self.info.stubs = [router_pb2_grpc.RouterStub(self._channels[a].info) for a in wanted]
        if added or gone:
            log.info("parse.router_replicas", replicas=list(wanted), added=added,
                     removed=[r.address for r in gone])

    def _open(self, address: str, name: str) -> _Channels:
        options = list(CHANNEL_OPTIONS)
        if name and self._tls.enabled:  # dialled by address: the certificate must still name the DNS name
            options.append(("grpc.ssl_target_name_override", name))
        credentials = self._tls.channel_credentials() if self._tls.enabled else None
        interceptors = self._tracing.client_interceptors() if self._tracing is not None else None
        info = (grpc.aio.secure_channel(address, credentials, options=options, interceptors=interceptors)
                if credentials is not None else
                grpc.aio.insecure_channel(address, options=options, interceptors=interceptors))
        return _Channels(MuxChannel(address, options=options, credentials=credentials), info)

    def _starved(self) -> None:
        if (not any(t.dns for t in self.targets) or time.monotonic() - self._last_lookup < STARVED_EVERY
                or (self._lookup is not None and not self._lookup.done())):
            return
        self._lookup = asyncio.create_task(self.resolve(), name="router-dns-lookup")

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self._refresh)
            try:
                await self.resolve()
            except Exception:
                log.exception("parse.router_dns_failed")
            await self._close_idle()

    async def _close_idle(self) -> None:
        now = time.monotonic()
        idle = [(r, c) for r, c in self._retired if r.open <= 0 or now - c.retired_at > RETIRED_GRACE]
        self._retired = [rc for rc in self._retired if rc not in idle]
        for _, channels in idle:
            await channels.mux.close()
            await channels.info.close()

    async def close(self) -> None:
        for task in (self._task, self._lookup):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for channels in [*self._channels.values(), *(c for _, c in self._retired)]:
            await channels.mux.close()
            await channels.info.close()
        self._channels.clear()
        self._retired.clear()
