"""Scale-out on loopback (issue 18): every process kind as replicas, state in a 3-node NATS JetStream cluster.

A 3-node NATS JetStream cluster (cluster routes, token auth), 2 gateways, 2 parse services, 2 routers and 3
mocker workers, each a separate process started with its real options (``tests/support/cluster.py``). A
client that alternates gateways completes a Responses conversation with ``previous_response_id`` across
replicas, an Anthropic tool loop whose turn 2 is cached, and a session whose prefix-break report (and,
where the gateway can share them, turn links) survives turns landing on different replicas. Then, under
steady load from clients that retry as the SDKs do, one replica of each kind and one NATS node are SIGKILLed:
no client request fails, and the KV index of each surviving router equals the surviving workers' block sets
within 5 s (the routers' ``harnessmesh_router_index_blocks`` / ``_digest`` gauges against each worker's
``KvRecovery.Dump``). Any failed request, or an index that disagrees, fails it (a parse replica killed
mid-stream costs nothing: the gateway resumes its streams on the other, ``gateway/parse_client.py``). The
processes are shared by the module's tests, in file order: the last one kills some.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from itertools import count, pairwise
from pathlib import Path
from typing import Any

import httpx
import nats
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.settings import GatewaySettings
from services.common.settings import fields_of
from services.router.metrics import index_digest
from services.router.settings import RouterSettings
from services.worker.settings import WorkerSettings
from tests.support.cluster import Cluster, MeshOptions, Sizes, list_workers, running_cluster, worker_blocks
from tests.support.otlp import Collector, running_collector

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

TOOL_TURN = (
    "<think>\nThe user wants the weather in Paris.\n</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
LOAD_TEXT = ("Steady as she goes: every token of this answer arrives exactly once, in order, whichever "
             "gateway, parse service, router, worker or NATS node carried it, and the stream ends cleanly.")
SCRIPT = [
    {"match": "weather in Paris", "completion": TOOL_TURN},
    {"match": "22 degrees", "completion": "<think>\nThe tool answered.\n</think>\n\nIt is 22 degrees in Paris."},
    {"match": "steady load", "completion": LOAD_TEXT},
    {"match": "", "completion": "Hello from the mesh."},
]
WEATHER: Any = [{"type": "function", "name": "get_weather", "description": "Current weather.",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
ANTHROPIC_WEATHER = [{"name": "get_weather", "description": "Current weather.",
                      "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
JETSTREAM_MAX_BYTES = str(64 << 20)  # a bucket's cap must fit every node's max_file_store (1 GB here)


def _has(settings: type[Any], name: str) -> bool:
    return any(f.name == name for f in fields_of(settings))


# Turn links in JetStream (issue 18): where the gateway has the option, its bucket is used and the session test
# asserts that each turn links to the one before across gateways; without it a trajectory's links stay in each
# gateway's memory and that part is not asserted (nothing shared to check).
TURN_LINKS_STORE = _has(GatewaySettings, "turn_links_store")
# The worker registry in a JetStream KV bucket (issue 18): where workers and routers have the option, its bucket
# gets 3 copies here (it must survive the NATS node killed); without it routers learn the fleet from heartbeats.
REGISTRY_STORE = _has(WorkerSettings, "registry_store") and _has(RouterSettings, "registry_store")

LOAD_CLIENTS = 4
LOAD_BEFORE_KILL = 2.0     # seconds of steady load before the kills
LOAD_AFTER_KILL = 6.0      # ... and after (the dead worker expires after --worker-timeout)
INDEX_AGREEMENT = 5.0      # seconds the surviving routers' indexes have to equal the workers' block sets
RETRYABLE = frozenset({429, 503, 529})
RETRY_BUDGET = 20.0        # seconds a client keeps retrying one refused request (SDKs: retries with backoff)


@dataclass
class Scaled:
    """The running cluster and the collector its gateways export spans to."""

    cluster: Cluster
    collector: Collector

    def gateway(self, i: int) -> str:
        return self.cluster.procs[f"gateway-{i}"].http


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scaled]:
    tmp = tmp_path_factory.mktemp("scale_out")
    script = tmp / "script.jsonl"
    script.write_text("".join(json.dumps(line) + "\n" for line in SCRIPT))
    model = ("--served-model-name", "demo")
    options = MeshOptions(
        worker=("--speedup", "2", "--script", str(script), "--block-size", "16", "--num-blocks", "2048",
                "--heartbeat-interval", "0.2", "--drain-grace", "1",
                *(("--registry-store", "jetstream") if REGISTRY_STORE else ()),
                *(("--registry-replicas", "3") if _has(WorkerSettings, "registry_replicas") else ())),
        router=("--worker-timeout", "1.5", *(("--registry-store", "jetstream") if REGISTRY_STORE else ())),
        parse=(*model, "--reasoning-parser", "qwen3", "--tool-parser", "hermes",
               "--prefix-watch-store", "jetstream", "--prefix-watch-replicas", "3",
               "--prefix-watch-max-bytes", JETSTREAM_MAX_BYTES),
        gateway=(*model, "--responses-store", "jetstream", "--responses-store-replicas", "3",
                 "--responses-store-max-bytes", JETSTREAM_MAX_BYTES,
                 *(("--turn-links-store", "jetstream", "--turn-links-replicas", "3", "--turn-links-max-bytes",
                    JETSTREAM_MAX_BYTES) if TURN_LINKS_STORE else ())),
        env={"HARNESSMESH_GATEWAY_THINKING_SIGNATURE_KEY": "scale-out-test-key"},  # one key for both gateways
    )
    with running_collector() as (endpoint, collector):
        traced = replace(options, gateway_env={  # the gateways' spans carry the turn links
            "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_BSP_SCHEDULE_DELAY": "100"})
        with running_cluster(tmp, Sizes(), traced) as cluster:
            yield Scaled(cluster, collector)


# -- state across replicas --------------------------------------------------------------------------


def _openai(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=60)


async def test_responses_conversation_across_gateways(scaled: Scaled) -> None:
    a, b = _openai(scaled.gateway(0)), _openai(scaled.gateway(1))
    first = await a.responses.create(model="demo", input="What is the weather in Paris?", tools=WEATHER)
    (call,) = [item for item in first.output if item.type == "function_call"]
    second = await b.responses.create(  # the other gateway: the response comes from the JetStream bucket
        model="demo", previous_response_id=first.id, tools=WEATHER,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "22 degrees"}])
    assert second.output_text == "It is 22 degrees in Paris."
    assert second.usage is not None and second.usage.input_tokens_details.cached_tokens > 0
    third = await a.responses.create(model="demo", previous_response_id=second.id, input="Thanks")
    assert third.output_text == "Hello from the mesh."
    assert (await b.responses.retrieve(third.id)).previous_response_id == second.id


async def test_anthropic_tool_loop_turn_two_cached_on_the_other_gateway(scaled: Scaled) -> None:
    headers = {"anthropic-version": "2023-06-01", "x-api-key": "k", "x-session-id": "tool-" + uuid.uuid4().hex}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris?"}]
    body = {"model": "demo", "max_tokens": 256, "tools": ANTHROPIC_WEATHER}
    async with httpx.AsyncClient(timeout=60, headers=headers) as http:
        one = await http.post(scaled.gateway(0) + "/v1/messages", json={**body, "messages": messages})
        assert one.status_code == 200, one.text
        turn1 = one.json()
        assert turn1["stop_reason"] == "tool_use"
        (use,) = [block for block in turn1["content"] if block["type"] == "tool_use"]
        messages += [{"role": "assistant", "content": turn1["content"]},  # its thinking block signed by gateway 0
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                   "content": "22 degrees"}]}]
        two = await http.post(scaled.gateway(1) + "/v1/messages", json={**body, "messages": messages})
    assert two.status_code == 200, two.text
    turn2 = two.json()
    assert [b["text"] for b in turn2["content"] if b["type"] == "text"] == ["It is 22 degrees in Paris."]
    assert turn2["usage"]["cache_read_input_tokens"] > 0  # turn 1's prompt, on the worker that holds it


def _breaks(log: Path, session: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log.read_text().splitlines() if '"parse.prefix_break"' in line]
    return [line for line in lines if line.get("session_id", "").split("/")[0] == session]  # session/trajectory


async def test_session_break_report_and_turn_links_across_replicas(scaled: Scaled) -> None:
    session, trajectory = "sess-" + uuid.uuid4().hex, "traj-" + uuid.uuid4().hex
    headers = {"x-session-id": session, "x-trajectory-id": trajectory, "anthropic-version": "2023-06-01",
               "x-api-key": "k"}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Say hello"}]
    systems = ["You are a helpful agent. build=1", "You are a helpful agent. build=2",
               "You are a helpful agent. build=2"]
    async with httpx.AsyncClient(timeout=60, headers=headers) as http:
        for i, system in enumerate(systems):  # gateways 0, 1, 0: each dials its own parse replica first
            reply = await http.post(scaled.gateway(i % 2) + "/v1/messages", json={
                "model": "demo", "max_tokens": 64, "system": system, "messages": messages})
            assert reply.status_code == 200, reply.text
            messages += [{"role": "assistant", "content": reply.json()["content"]},
                         {"role": "user", "content": f"Again, {i}"}]
    procs = scaled.cluster.procs
    # turn 2 ran on parse 1, which never saw turn 1: it found the changed header in the shared copy
    (report,) = _breaks(procs["parse-1"].log, session)
    assert "build=⟂1" in report["expected"] and "build=⟂2" in report["actual"]
    assert _breaks(procs["parse-0"].log, session) == []  # turn 3 extends turn 2: nothing to report
    if not TURN_LINKS_STORE:
        return  # turn links are still per gateway: nothing shared to assert (see TURN_LINKS_STORE)
    roots = await _chat_roots(scaled.collector, session, 3)
    for earlier, later in pairwise(roots):  # each turn links to the one before, any gateway
        assert (earlier.trace_id, earlier.span_id) in later.links


async def _chat_roots(collector: Collector, session: str, count: int) -> list[Any]:
    for _ in range(100):
        roots = sorted((s for s in collector.snapshot() if s.name == "chat demo"
                        and s.attributes.get("session.id") == session), key=lambda s: s.start_ns)
        if len(roots) >= count:
            return roots
        await asyncio.sleep(0.1)
    raise AssertionError(f"{count} turn spans of {session} not exported")


# -- steady load, then one replica of each kind and one NATS node killed ----------------------------


@dataclass
class Tally:
    """What the load clients saw."""

    sent: int = 0                     # requests (a retried one counts once)
    attempts: int = 0
    retried: Counter[str] = field(default_factory=Counter)   # refusals retried, by cause
    failures: list[str] = field(default_factory=list)
    failed_at: list[float] = field(default_factory=list)    # time.monotonic() of each failure
    by_api: Counter[str] = field(default_factory=Counter)
    in_flight: Counter[str] = field(default_factory=Counter)  # attempts open per gateway


class Refused(Exception):
    """A request refused before any byte of a response: the client may send it again."""


API_PATHS = {"chat": "/v1/chat/completions", "anthropic": "/v1/messages", "responses": "/v1/responses"}


def _body(api: str, prompt: str, previous: str | None) -> dict[str, Any]:
    messages = [{"role": "user", "content": prompt}]
    if api == "chat":
        return {"model": "demo", "stream": True, "messages": messages}
    if api == "anthropic":
        return {"model": "demo", "max_tokens": 512, "stream": True, "messages": messages}
    chained = {"previous_response_id": previous} if previous else {}
    return {"model": "demo", "stream": True, "input": prompt, **chained}


async def _events(response: httpx.Response) -> AsyncIterator[tuple[str, Any]]:
    event = ""
    async for line in response.aiter_lines():
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
            yield event, (data if data == "[DONE]" else json.loads(data))
            event = ""


async def _read_stream(api: str, response: httpx.Response) -> tuple[str, str | None]:
    """The streamed text and (Responses) the response id; raises AssertionError unless the stream ended well."""
    text, done, response_id = [], False, None
    async for event, data in _events(response):
        if api == "chat":
            if data == "[DONE]":
                done = True
                continue
            assert "error" not in data, data
            for choice in data["choices"]:
                text.append(choice["delta"].get("content") or "")
                assert choice.get("finish_reason") in (None, "stop"), data
        elif api == "anthropic":
            assert event != "error", data
            if event == "content_block_delta" and data["delta"]["type"] == "text_delta":
                text.append(data["delta"]["text"])
            done = done or event == "message_stop"
        else:
            failed = data["type"] in ("error", "response.failed", "response.incomplete")
            assert not failed, (data.get("response") or {}).get("error") or data
            if data["type"] == "response.output_text.delta":
                text.append(data["delta"])
            if data["type"] == "response.completed":
                done, response_id = True, data["response"]["id"]
    assert done, f"{api} stream ended without its final event"
    return "".join(text), response_id


async def _attempt(http: httpx.AsyncClient, gateway: str, api: str, body: dict[str, Any]) -> str | None:
    """One attempt; :class:`Refused` when it may be retried, AssertionError when an admitted stream failed."""
    admitted = False
    try:
        async with http.stream("POST", gateway + API_PATHS[api], json=body) as response:
            admitted = True
            if response.status_code in RETRYABLE:
                await response.aread()
                raise Refused(str(response.status_code))
            assert response.status_code == 200, (response.status_code, (await response.aread())[:500])
            text, response_id = await _read_stream(api, response)
            assert text == LOAD_TEXT, f"{api}: {text!r}"
            return response_id
    except httpx.TransportError as exc:
        if admitted:
            raise AssertionError(f"{api} stream broken after admission: {type(exc).__name__}: {exc}") from exc
        raise Refused(type(exc).__name__) from exc


async def _client(n: int, gateways: list[str], stop: asyncio.Event, tally: Tally) -> None:
    """Streams one request after another, alternating APIs over the gateways in rotation (``gateways``, shared:
    the load balancer's view); a refused request is sent again, to the next gateway, with backoff, for up to
    :data:`RETRY_BUDGET` seconds."""
    apis = ["chat", "anthropic", "responses"]
    previous: str | None = None
    i = 0
    headers = {"anthropic-version": "2023-06-01", "x-api-key": "k"}
    async with httpx.AsyncClient(timeout=httpx.Timeout(30, connect=2), headers=headers) as http:
        while not stop.is_set():
            api = apis[(n + i) % len(apis)]
            body = _body(api, f"steady load, client {n}, request {i}", previous)
            tally.sent += 1
            tally.by_api[api] += 1
            give_up, backoff = time.monotonic() + RETRY_BUDGET, 0.1
            for attempt in count():
                tally.attempts += 1
                gateway = gateways[(n + i + attempt) % len(gateways)]
                tally.in_flight[gateway] += 1
                try:
                    response_id = await _attempt(http, gateway, api, body)
                    if api == "responses":
                        previous = response_id
                    break
                except Refused as refusal:
                    tally.retried[str(refusal)] += 1
                    if time.monotonic() > give_up:
                        tally.failures.append(f"client {n} request {i} ({api}): refused past the retry budget")
                        tally.failed_at.append(time.monotonic())
                        break
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 1.0)
                except AssertionError as exc:
                    tally.failures.append(f"client {n} request {i} ({api}) via {gateway}: {exc}")
                    tally.failed_at.append(time.monotonic())
                    break
                finally:
                    tally.in_flight[gateway] -= 1
            i += 1


def _gauges(url: str, name: str) -> dict[str, float]:
    text = httpx.get(url, timeout=2).text
    return {s.labels["worker"]: s.value for family in text_string_to_metric_families(text)
            if family.name == name for s in family.samples}


def _disagreements(cluster: Cluster) -> list[str]:
    """Where a surviving router's KV index differs from the surviving workers' own block sets ([] when none)."""
    workers = {w.name: worker_blocks(w) for w in cluster.of("worker")}
    problems = []
    for router in cluster.of("router"):
        counts = _gauges(router.metrics, "harnessmesh_router_index_blocks")
        digests = _gauges(router.metrics, "harnessmesh_router_index_digest")
        routes_to = list_workers(router)
        if set(counts) != set(workers) or routes_to != set(workers):
            problems.append(f"{router.name}: index of {sorted(counts)}, routes to {sorted(routes_to)}, "
                            f"workers alive {sorted(workers)}")
        for name, blocks in workers.items():
            if (counts.get(name), digests.get(name)) != (len(blocks), index_digest(blocks)):
                problems.append(f"{router.name}: {name} indexed {counts.get(name)} blocks, holds {len(blocks)}")
    return problems


async def _responses_with_retry(gateway: str, previous: str) -> dict[str, Any]:
    """A non-streaming Responses turn after ``previous``, sent again while refused (an SDK's retries)."""
    async with httpx.AsyncClient(timeout=30) as http:
        for _ in range(40):
            reply = await http.post(gateway + "/v1/responses", json={
                "model": "demo", "input": "After the kills", "previous_response_id": previous})
            if reply.status_code not in RETRYABLE:
                assert reply.status_code == 200, reply.text
                body: dict[str, Any] = reply.json()
                return body
            await asyncio.sleep(0.5)
    raise AssertionError(f"refused for 20 s: {reply.status_code} {reply.text}")


def _busiest(cluster: Cluster, kind: str, metric: str) -> tuple[str, int]:
    """The replica of ``kind`` with the most requests in flight (the sum of its gauge ``metric``), and how many."""
    load = {p.name: int(sum(_gauges(p.metrics, metric).values())) for p in cluster.of(kind)}
    busiest = max(load, key=lambda name: load[name])
    return busiest, load[busiest]


async def _stream_leader(cluster: Cluster, stream: str) -> str:
    """The NATS node (``nats-N``) leading JetStream stream ``stream``."""
    nc = await nats.connect(cluster.nats_urls.split(","), token=cluster.token, connect_timeout=2)
    try:
        info = await nc.jetstream().stream_info(stream)
    finally:
        await nc.close()
    assert info.cluster is not None and info.cluster.leader
    return "nats-" + info.cluster.leader.removeprefix("n")


async def test_kill_one_of_each_kind_under_load(scaled: Scaled) -> None:
    """Steady streaming load over both gateways and all three APIs; then at once SIGKILL the worker and the router
    with the most requests in flight, parse 0 (gateway 0's parse: it must move to parse 1), gateway 1 and the
    NATS node leading the Responses bucket. Gateway 1 is first taken out of the load balancer's rotation and its
    open streams finish: a stream whose client connection ends at a killed process cannot be completed by any
    server."""
    cluster = scaled.cluster
    nats_victim = await _stream_leader(cluster, "KV_harnessmesh_default_responses")
    rotation = [p.http for p in cluster.of("gateway")]
    before = await _openai(scaled.gateway(1)).responses.create(model="demo", input="Before the kills")
    tally, stop = Tally(), asyncio.Event()
    clients = [asyncio.create_task(_client(n, rotation, stop, tally)) for n in range(LOAD_CLIENTS)]
    try:
        await asyncio.sleep(LOAD_BEFORE_KILL)
        assert tally.sent >= LOAD_CLIENTS and not tally.failures, tally
        drained = cluster.procs["gateway-1"].http
        rotation.remove(drained)
        for _ in range(100):
            if not tally.in_flight[drained]:
                break
            await asyncio.sleep(0.05)
        worker, worker_load = _busiest(cluster, "worker", "harnessmesh_worker_active_requests")
        router, router_load = _busiest(cluster, "router", "harnessmesh_router_worker_active_requests")
        victims = [worker, router, "parse-0", "gateway-1", nats_victim]
        for victim in victims:
            cluster.kill(victim)
        killed_at = time.monotonic()
        await asyncio.sleep(LOAD_AFTER_KILL)
    finally:
        stop.set()
        await asyncio.gather(*clients)
    quiet_at = time.monotonic()
    problems = _disagreements(cluster)
    while problems and time.monotonic() - quiet_at < INDEX_AGREEMENT:
        await asyncio.sleep(0.1)
        problems = _disagreements(cluster)
    agreed = time.monotonic()
    print(f"scale-out: {tally.sent} requests sent ({dict(tally.by_api)}), {tally.attempts} attempts, "
          f"{len(tally.failures)} failed, retried {dict(tally.retried)}; killed {victims} ({worker} with "
          f"{worker_load} requests in flight, {router} with {router_load}); index agreed "
          f"{agreed - quiet_at:.2f}s after the load stopped ({agreed - killed_at:.2f}s after the kills); "
          f"failures {[round(t - killed_at, 1) for t in tally.failed_at]} s after the kills")
    assert not problems, problems
    assert all(worker_blocks(w) for w in cluster.of("worker"))  # the comparison was not of empty sets
    # a response stored through the killed gateway, in the bucket whose leader was killed, continues on the other
    after = await _responses_with_retry(scaled.gateway(0), before.id)
    assert after["output"] and after["previous_response_id"] == before.id  # the comparison was not of empty sets
    assert tally.sent > 4 * LOAD_CLIENTS  # the load kept flowing through the kills
    assert not tally.failures, "\n".join(tally.failures[:20])
