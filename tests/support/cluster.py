"""A scaled-out mesh on loopback: a 3-node NATS JetStream cluster and every process kind as replicas.

Unlike :mod:`tests.support.mesh` (``harnessmesh up``: one of each), each process here is started by hand
with ``python -m <module>`` and its real options, as a Kubernetes pod would run it: N gateways, N parse
services, N routers and N mocker workers, each given the NATS cluster as a comma-separated server list and
the token in its environment (never on a command line). Every process is a direct child of the test, so
:meth:`Cluster.kill` signals exactly it, by pid, and :func:`running_cluster` stops every one it started,
failed start-up included.

What a Kubernetes Service would do for gateway -> parse (a ClusterIP connection lands on any ready pod,
and the next connection on another when that one goes) is done with gRPC's ``ipv4:`` target, which lists
every parse replica (this gateway's own first) under gRPC's default ``pick_first`` policy.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.api import kv_pb2, kv_pb2_grpc, router_pb2, router_pb2_grpc
from tests.support.nats import free_port, nats_server_binary

STOP_GRACE = 10.0


@dataclass
class Proc:
    """One process the cluster started: its kind, addresses and log."""

    name: str
    kind: str                      # nats | worker | router | parse | gateway
    popen: subprocess.Popen[bytes]
    log: Path
    address: str = ""              # gRPC host:port (NATS: its client URL)
    http: str = ""                 # gateway: its HTTP base URL; NATS: its monitoring URL
    metrics: str = ""              # parse, router, worker: /metrics URL

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass(frozen=True)
class Sizes:
    """How many replicas of each kind."""

    nats: int = 3
    workers: int = 3
    routers: int = 2
    parses: int = 2
    gateways: int = 2


@dataclass
class Cluster:
    """The processes of one scaled-out mesh (see module docstring), by name: ``nats-0``, ``worker-1``, ..."""

    tmp: Path
    token: str
    procs: dict[str, Proc] = field(default_factory=dict)

    def of(self, kind: str, *, alive: bool = True) -> list[Proc]:
        return [p for p in self.procs.values() if p.kind == kind and (p.alive() or not alive)]

    @property
    def nats_urls(self) -> str:
        return ",".join(p.address for p in self.of("nats", alive=False))

    def kill(self, name: str) -> None:
        """SIGKILL ``name`` (a process this cluster started) and reap it."""
        proc = self.procs[name]
        os.kill(proc.pid, signal.SIGKILL)
        proc.popen.wait(10)

    def spawn(self, name: str, kind: str, argv: Sequence[str], env: dict[str, str], **where: str) -> Proc:
        log = self.tmp / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, env=env)
        proc = Proc(name, kind, popen, log, **where)
        self.procs[name] = proc
        return proc

    def stop(self) -> None:
        """SIGTERM every service still running, then the NATS nodes (so the services' last flush finds one),
        each group SIGKILLed where it is not gone after :data:`STOP_GRACE`."""
        services = [p for p in self.procs.values() if p.kind != "nats"]
        for group in (services, self.of("nats")):
            running = [p for p in group if p.alive()]
            for proc in running:
                proc.popen.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE
            for proc in running:
                try:
                    proc.popen.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.popen.kill()
                    proc.popen.wait()

    def logs(self, tail: int = 3000) -> str:
        """The end of every process's log, for a failure message."""
        return "\n".join(f"--- {p.name} (pid {p.pid}, exit {p.popen.returncode}) ---\n"
                         f"{p.log.read_text(errors='replace')[-tail:]}" for p in self.procs.values())


# -- NATS ------------------------------------------------------------------------------------------


def _nats_config(tmp: Path, index: int, token: str, client: list[int], routes: list[int], http: int) -> Path:
    store = tmp / f"nats-{index}-store"
    store.mkdir()
    path = tmp / f"nats-{index}.conf"
    path.touch(mode=0o600)
    peers = ", ".join(f"nats-route://127.0.0.1:{port}" for i, port in enumerate(routes) if i != index)
    path.write_text(
        f"server_name: n{index}\nlisten: 127.0.0.1:{client[index]}\nhttp: 127.0.0.1:{http}\n"
        f"jetstream {{ store_dir: {json.dumps(str(store))}, max_file_store: 1GB, max_memory_store: 64MB }}\n"
        f"authorization {{ token: {json.dumps(token)} }}\n"
        f"cluster {{ name: harnessmesh, listen: 127.0.0.1:{routes[index]}, routes: [{peers}] }}\n")
    return path


def start_nats_cluster(cluster: Cluster, nodes: int) -> None:
    """``nodes`` nats-servers routed into one JetStream cluster, each requiring ``cluster.token``."""
    client = [free_port() for _ in range(nodes)]
    routes = [free_port() for _ in range(nodes)]
    for i in range(nodes):
        http = free_port()
        config = _nats_config(cluster.tmp, i, cluster.token, client, routes, http)
        cluster.spawn(f"nats-{i}", "nats", [nats_server_binary(), "-c", str(config)], dict(os.environ),
                      address=f"nats://127.0.0.1:{client[i]}", http=f"http://127.0.0.1:{http}")


def wait_jetstream(cluster: Cluster, timeout: float) -> None:
    """Until every node's ``/healthz`` says JetStream is current (a meta leader elected, the node caught up)."""
    deadline = time.monotonic() + timeout
    for node in cluster.of("nats"):
        while True:
            _check_alive(cluster)
            try:
                if httpx.get(node.http + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{node.name}: JetStream not healthy within {timeout:.0f}s")
            time.sleep(0.1)


# -- the mesh's processes -------------------------------------------------------------------------


@dataclass(frozen=True)
class MeshOptions:
    """Options every replica of a kind gets (beyond the wiring: ports, addresses, NATS)."""

    worker: tuple[str, ...] = ()
    router: tuple[str, ...] = ()
    parse: tuple[str, ...] = ()
    gateway: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)           # every service
    gateway_env: dict[str, str] = field(default_factory=dict)   # gateways only (e.g. OTLP export)


def _python(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def start_services(cluster: Cluster, sizes: Sizes, options: MeshOptions) -> None:
    """Workers, routers, parse services and gateways, all at once: each waits for what it needs itself."""
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "none", "HARNESSMESH_NATS_TOKEN": cluster.token, **options.env}
    nats = ["--nats-url", cluster.nats_urls]
    for i in range(sizes.workers):
        port, metrics = free_port(), free_port()
        cluster.spawn(f"worker-{i}", "worker", _python(
            "services.worker", "--worker-id", f"worker-{i}", "--host", "127.0.0.1", "--port", str(port),
            "--advertise-host", "127.0.0.1", "--metrics-port", str(metrics), *nats, *options.worker), env,
            address=f"127.0.0.1:{port}", metrics=f"http://127.0.0.1:{metrics}/metrics")
    routers = []
    for i in range(sizes.routers):
        port, metrics = free_port(), free_port()
        routers.append(f"127.0.0.1:{port}")
        cluster.spawn(f"router-{i}", "router", _python(
            "services.router", "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics),
            *nats, *options.router), env,
            address=routers[-1], metrics=f"http://127.0.0.1:{metrics}/metrics")
    parses = []
    for i in range(sizes.parses):
        port, metrics = free_port(), free_port()
        parses.append(f"127.0.0.1:{port}")
        cluster.spawn(f"parse-{i}", "parse", _python(
            "services.parse", "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics),
            "--router-address", ",".join(routers), *nats, *options.parse), env,
            address=parses[-1], metrics=f"http://127.0.0.1:{metrics}/metrics")
    gateway_env = {**env, **options.gateway_env}
    for i in range(sizes.gateways):
        http, grpc_port = free_port(), free_port()
        mine = parses[i % len(parses):] + parses[:i % len(parses)]  # its own parse replica first
        cluster.spawn(f"gateway-{i}", "gateway", _python(
            "gateway", "--host", "127.0.0.1", "--http-port", str(http), "--grpc-port", str(grpc_port),
            "--parse-address", "ipv4:" + ",".join(mine), *nats, *options.gateway), gateway_env,
            address=f"127.0.0.1:{grpc_port}", http=f"http://127.0.0.1:{http}")


def _check_alive(cluster: Cluster) -> None:
    dead = [p for p in cluster.procs.values() if not p.alive()]
    if dead:
        raise RuntimeError(f"{dead[0].name} exited with {dead[0].popen.returncode}:\n"
                           f"{dead[0].log.read_text(errors='replace')[-4000:]}")


def list_workers(router: Proc, timeout: float = 2.0) -> set[str]:
    """The worker ids ``router`` routes to (its ``ListWorkers``)."""
    with grpc.insecure_channel(router.address) as channel:
        reply = router_pb2_grpc.RouterStub(channel).ListWorkers(router_pb2.ListWorkersRequest(), timeout=timeout)
    return {w.worker_id for w in reply.workers}


def serving(proc: Proc, timeout: float = 1.0) -> bool:
    """Whether ``proc``'s gRPC health says SERVING."""
    try:
        with grpc.insecure_channel(proc.address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
    except grpc.RpcError:
        return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def worker_blocks(worker: Proc, timeout: float = 2.0) -> frozenset[int]:
    """The worker's whole published block set (its ``KvRecovery.Dump``, what a router repairs from)."""
    with grpc.insecure_channel(worker.address) as channel:
        dump = kv_pb2_grpc.KvRecoveryStub(channel).Dump(kv_pb2.KvDumpRequest(), timeout=timeout)
    return frozenset(dump.block_hashes)


def wait_ready(cluster: Cluster, timeout: float) -> None:
    """Until every router lists every worker and every gateway's ``GET /ready`` answers 200."""
    deadline = time.monotonic() + timeout
    workers = {p.name for p in cluster.of("worker")}
    pending: list[Proc] = cluster.of("router") + cluster.of("parse") + cluster.of("gateway")
    while pending:
        _check_alive(cluster)
        proc = pending[0]
        try:
            if proc.kind == "router":
                ready = list_workers(proc) == workers
            elif proc.kind == "parse":
                ready = serving(proc)
            else:
                ready = httpx.get(proc.http + "/ready", timeout=2).status_code == 200
        except (grpc.RpcError, httpx.HTTPError):
            ready = False
        if ready:
            pending.pop(0)
            continue
        if time.monotonic() > deadline:
            raise TimeoutError(f"{proc.name} not ready within {timeout:.0f}s")
        time.sleep(0.2)


@contextmanager
def running_cluster(tmp: Path, sizes: Sizes, options: MeshOptions, timeout: float = 60.0) -> Iterator[Cluster]:
    """Start the NATS cluster, then every service; yield once all are ready; stop every process started,
    whatever happened (start-up failures included)."""
    cluster = Cluster(tmp, secrets.token_urlsafe(24))
    with ExitStack() as stack:
        stack.callback(cluster.stop)
        deadline = time.monotonic() + timeout
        start_nats_cluster(cluster, sizes.nats)
        wait_jetstream(cluster, deadline - time.monotonic())
        start_services(cluster, sizes, options)
        try:
            wait_ready(cluster, deadline - time.monotonic())
        except Exception as exc:
            raise RuntimeError(f"{exc}\n{cluster.logs()}") from exc
        yield cluster
