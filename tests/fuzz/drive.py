"""Drives the fuzz cases against a running mesh and tallies what came back (shared by ``bench/fuzz.py`` and
``tests/fuzz/test_fuzz_mesh.py``).

HTTP cases run on ``lanes`` clients of one keep-alive connection each; after every ``follow_every``-th case
of a lane a small valid request of the same API goes out on that same connection and must succeed (and
reuse the connection unless the server said ``connection: close``). gRPC cases run on one channel.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx

from services.api import chat_pb2, chat_pb2_grpc, common_pb2
from tests.fuzz.check import status_problems, stream_problems
from tests.fuzz.generate import Case, cases, follow_up
from tests.fuzz.grpc_cases import CLIENT_STATUSES, GrpcCase, grpc_cases
from tests.support.procs import child_pids

TIMEOUT = 60.0


@dataclass
class Finding:
    """One problem: where, what, and enough of the request to reproduce it."""

    where: str
    index: int
    problem: str
    mutations: tuple[str, ...]
    excerpt: str

    def as_dict(self) -> dict[str, Any]:
        return {"where": self.where, "index": self.index, "problem": self.problem,
                "mutations": list(self.mutations), "request_excerpt": self.excerpt}


@dataclass
class Tally:
    """Counts per endpoint and status, follow-up results and findings."""

    statuses: Counter[tuple[str, str]] = field(default_factory=Counter)
    follow_ups: int = 0
    reused: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())

    def add(self, finding: Finding) -> None:
        self.findings.append(finding)


def _excerpt(body: bytes, limit: int = 400) -> str:
    text = repr(body[:limit])
    return text + (f" ... ({len(body)} bytes)" if len(body) > limit else "")


def _client_addr(response: httpx.Response) -> Any:
    stream = response.extensions.get("network_stream")
    return stream.get_extra_info("client_addr") if stream is not None else None


async def _send(http: httpx.AsyncClient, path: str, body: bytes,
                headers: dict[str, str | bytes]) -> tuple[int, bytes, httpx.Response]:
    raw = [(k.encode(), v if isinstance(v, bytes) else v.encode()) for k, v in headers.items()]
    async with http.stream("POST", path, content=body, headers=raw) as response:
        data = await response.aread()
    return response.status_code, data, response


async def http_case(http: httpx.AsyncClient, case: Case, tally: Tally) -> httpx.Response | None:
    label = f"{case.path}{' stream' if case.stream else ''}"
    try:
        status, data, response = await _send(http, case.path, case.body, case.headers)
    except (httpx.HTTPError, OSError) as exc:
        tally.statuses[(label, type(exc).__name__)] += 1
        tally.add(Finding(label, case.index, f"transport error {exc!r}", case.mutations, _excerpt(case.body)))
        return None
    tally.statuses[(label, str(status))] += 1
    streamed = response.headers.get("content-type", "").startswith("text/event-stream")
    if status == 200 and streamed:
        problems = stream_problems(case.api, data)
    else:
        problems = status_problems(status, data, case.anthropic_shape)
    if case.stream and not case.mutations and status == 200 and not streamed:
        problems.append("stream: true answered without an event stream")
    for problem in problems:
        tally.add(Finding(label, case.index, f"{problem} -> {data[:300]!r}", case.mutations, _excerpt(case.body)))
    return response


async def http_lane(base: str, lane: list[Case], tally: Tally, api_key: str, follow_every: int) -> None:
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(base_url=base, timeout=TIMEOUT, limits=limits) as http:
        for n, case in enumerate(lane, 1):
            response = await http_case(http, case, tally)
            if n % follow_every or response is None:
                continue
            path, body, headers = follow_up(case.api, api_key)
            tally.follow_ups += 1
            try:
                status, data, again = await _send(http, path, body, headers)
            except (httpx.HTTPError, OSError) as exc:
                tally.add(Finding("follow-up", case.index, f"transport error {exc!r}", case.mutations,
                                  _excerpt(case.body)))
                continue
            if status != 200:
                tally.add(Finding("follow-up", case.index, f"status {status}: {data[:200]!r}", case.mutations,
                                  _excerpt(case.body)))
            closing = response.headers.get("connection", "").lower() == "close"
            if _client_addr(again) == _client_addr(response) and _client_addr(again) is not None:
                tally.reused += 1
            elif not closing:
                tally.add(Finding("follow-up", case.index, "keep-alive connection not reused", case.mutations,
                                  _excerpt(case.body)))


async def grpc_case(channel: grpc.aio.Channel, case: GrpcCase, tally: Tally) -> None:
    stub = chat_pb2_grpc.AgentServiceStub(channel)
    label = "grpc Chat" + (" raw" if case.request is None else "")
    excerpt = _excerpt(case.raw) if case.request is None else str(case.request)[:400]
    try:
        if case.request is None:
            call = channel.unary_stream("/harnessmesh.v1.AgentService/Chat", request_serializer=lambda b: b,
                                        response_deserializer=chat_pb2.ChatEventBatch.FromString)
            batches = [b async for b in call(case.raw, metadata=case.metadata, timeout=TIMEOUT)]
        else:
            batches = [b async for b in stub.Chat(case.request, metadata=case.metadata, timeout=TIMEOUT)]
    except grpc.aio.AioRpcError as exc:
        tally.statuses[(label, exc.code().name)] += 1
        if exc.code() not in CLIENT_STATUSES:
            tally.add(Finding(label, case.index, f"{exc.code().name}: {exc.details()}", case.mutations, excerpt))
        return
    tally.statuses[(label, "OK")] += 1
    events = [e for b in batches for e in b.events]
    errors = [e.error for e in events if e.HasField("error")]
    if any(e.code == common_pb2.ERROR_CODE_INTERNAL for e in errors):
        tally.add(Finding(label, case.index, f"in-band {errors[0]}", case.mutations, excerpt))
    if not errors and not any(e.HasField("finish") for e in events):
        tally.add(Finding(label, case.index, "stream ended without finish or error", case.mutations, excerpt))


async def grpc_lane(target: str, lane: list[GrpcCase], tally: Tally) -> None:
    options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        for case in lane:
            await grpc_case(channel, case, tally)


async def run(http_base: str, grpc_target: str, *, requests: int, seed: int, api_key: str = "",
              lanes: int = 4, grpc_share: float = 0.15, follow_every: int = 50) -> tuple[Tally, float]:
    """Send ``requests`` fuzz requests (follow-ups not counted); returns the tally and the wall time."""
    n_grpc = int(requests * grpc_share)
    http_cases = list(cases(seed, requests - n_grpc, api_key))
    grpc_list = grpc_cases(seed, n_grpc, api_key)
    tally = Tally()
    started = time.monotonic()
    jobs = [http_lane(http_base, http_cases[i::lanes], tally, api_key, follow_every) for i in range(lanes)]
    jobs.append(grpc_lane(grpc_target, grpc_list, tally))
    await asyncio.gather(*jobs)
    return tally, time.monotonic() - started


def summary(tally: Tally) -> dict[str, Any]:
    per: dict[str, dict[str, int]] = {}
    for (where, status), count in sorted(tally.statuses.items()):
        per.setdefault(where, {})[status] = count
    return {"requests": tally.requests, "follow_ups": tally.follow_ups, "follow_ups_same_connection": tally.reused,
            "by_endpoint": per, "findings": len(tally.findings)}


# The mesh every fuzz run starts: one fast mocker worker, a small context (a fuzzed max_tokens cannot make a
# long turn), a 2 MB body limit (enormous strings fit, a few bodies go past it), --restart never (a crashed
# process ends the mesh instead of being quietly restarted) and an API key (bad keys are fuzzed too).
API_KEY = "sk-fuzz-3b9d"
MESH_ARGS = ["--workers", "1", "--speedup", "1000", "--served-model-name", "demo", "--reasoning-parser", "qwen3",
             "--tool-parser", "hermes", "--max-model-len", "2048", "--max-request-bytes", "2000000",
             "--restart", "never", "--log-level", "warning"]
MESH_ENV = {"HARNESSMESH_GATEWAY_API_KEY": API_KEY}
PROCESSES = ("nats-server", "services.router", "services.worker", "services.parse", "gateway")


def mesh_processes(launcher: int) -> dict[str, list[int]]:
    """Pids of the launcher's children, by program."""
    return {name: child_pids(launcher, name) for name in PROCESSES}


def processes_lost(before: dict[str, list[int]], launcher_alive: bool, after: dict[str, list[int]]) -> list[str]:
    """What died (or was restarted) between ``before`` and ``after``."""
    lost = [] if launcher_alive else ["launcher"]
    lost += [f"{name} {before[name]} -> {after[name]}" for name in PROCESSES if before[name] != after[name]]
    lost += [f"{name} never started" for name in PROCESSES if not before[name]]
    return lost
