"""Turn links shared by gateway replicas (``--turn-links-store jetstream``) against a real nats-server with
JetStream: a trajectory's turns on two replicas keep their previous-turn link and ``execute_tool`` span, one
read and one write per turn (never per token), anonymous turns stay in memory, NATS down costs no request."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.metrics import GatewayMetrics
from gateway.parse_client import ParseClient
from gateway.settings import GatewaySettings
from gateway.shared_state import open_state
from gateway.trace_records import TraceRecordSink, read_records
from gateway.turn_links import Dispatched, JetStreamTurnLinks, TrajectoryLinks, decode, encode
from gateway.turn_tracking import TurnTracker
from services.api import chat_pb2, common_pb2
from services.common.grpc_util import open_channel
from services.common.jetstream import Blob, BucketConfig, ChunkedKv, open_bucket
from tests.gateway.fake_parse import FakeParse, batch, call_start, dispatch, finish, started, text, usage

pytestmark = pytest.mark.timeout(60)


def _responder(request: chat_pb2.ChatRequest) -> list[chat_pb2.ChatEventBatch]:
    if request.messages[-1].role == "tool":  # several batches: the store is still touched once per turn
        return [batch(started(900, 512), text("do")), batch(text("ne")), batch(text(".")),
                batch(finish(), usage(900, 5, 512))]
    return [batch(started(600, 0), call_start(0, "call_1", "bash")),
            batch(dispatch(0, "call_1", "bash", '{"cmd": "ls"}')),
            batch(finish(common_pb2.FINISH_REASON_TOOL_CALLS), usage(600, 12))]


class CountingKv(ChunkedKv):
    """A real ChunkedKv that counts its reads and writes."""

    gets = 0
    puts = 0

    async def get(self, key: str, *, known: str = "") -> Blob | None:
        self.gets += 1
        return await super().get(key, known=known)

    async def put(self, key: str, value: bytes, *, replaces: Blob | None = None) -> Blob:
        self.puts += 1
        return await super().put(key, value, replaces=replaces)


class Replica:
    """One gateway replica's app: its own tracker, spans, metrics and records over the shared bucket."""

    def __init__(self, parse_address: str, kv: ChunkedKv | None, records: Path) -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = provider.get_tracer("t")
        self.metrics = GatewayMetrics()
        self.records = TraceRecordSink(records)
        self.records_path = records
        links = JetStreamTurnLinks(kv) if kv is not None else None
        self.channel = open_channel(parse_address, None)
        self.turns = TurnTracker(self.tracer, self.metrics, self.records, links=links)
        self.app = create_app(ParseClient(self.channel, turns=self.turns), GatewaySettings(), self.tracer,
                              self.metrics)

    def roots(self) -> list[ReadableSpan]:
        return sorted((s for s in self.exporter.get_finished_spans() if s.name == "chat demo"),
                      key=lambda s: s.start_time or 0)

    def metric(self, name: str) -> float:
        scrape = generate_latest(self.metrics.registry).decode()
        return next((s.value for f in text_string_to_metric_families(scrape) for s in f.samples if s.name == name), 0)

    async def close(self) -> None:
        await self.channel.close()
        self.records.close()


@pytest.fixture
async def bucket(nats_url: str) -> AsyncIterator[Any]:
    nc = await nats.connect(nats_url)
    yield await open_bucket(nc.jetstream(), BucketConfig(f"t_links_{uuid.uuid4().hex[:10]}", ttl=60))
    await nc.close()


async def _post(app: Any, messages: list[dict[str, Any]], headers: dict[str, str]) -> dict[str, Any]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        reply = await http.post("/v1/chat/completions", json={"model": "demo", "messages": messages}, headers=headers)
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


async def _tool_loop(first: Replica, second: Replica, headers: dict[str, str]) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "list the files"}]
    one = await _post(first.app, messages, headers)
    messages += [one["choices"][0]["message"], {"role": "tool", "tool_call_id": "call_1", "content": "file.txt"}]
    await _post(second.app, messages, headers)  # at once: turn 1's links were written before its end was sent


def test_links_round_trip_through_their_encoding() -> None:
    turn = trace.SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=trace.TraceFlags(1))
    calls = {f"call_{i}": Dispatched("bash", 1_700_000_000_000_000_000 + i, turn, "codex") for i in range(5)}
    back = decode(encode(TrajectoryLinks(turn, calls)))
    assert back.turn == turn and back.calls == calls
    assert list(decode(encode(TrajectoryLinks(None, calls), max_calls=2)).calls) == ["call_3", "call_4"]
    assert decode(encode(TrajectoryLinks())) == TrajectoryLinks()


async def test_a_trajectory_keeps_its_links_across_replicas(
    fake_parse: tuple[FakeParse, str], bucket: Any, tmp_path: Path
) -> None:
    fake_parse[0].responder = _responder
    kv = CountingKv(bucket, chunk_size=1 << 20)
    a, b = (Replica(fake_parse[1], kv, tmp_path / f"{n}.jsonl") for n in "ab")
    headers = {"x-session-id": "S", "x-trajectory-id": "T", "user-agent": "codex_exec/0.169.0"}
    try:
        await _tool_loop(a, b, headers)
    finally:
        await a.close()
        await b.close()
    assert (kv.gets, kv.puts) == (2, 2)  # one read and one write per turn, none per batch
    (turn1,), (turn2,) = a.roots(), b.roots()
    first_ctx = turn1.get_span_context()
    assert first_ctx is not None
    assert [(link.context.trace_id, link.context.span_id) for link in turn2.links] == [
        (first_ctx.trace_id, first_ctx.span_id)]
    assert dict(turn2.links[0].attributes or {}) == {"link.type": "previous_turn"}
    (tool,) = [s for s in b.exporter.get_finished_spans() if s.name == "execute_tool bash"]
    turn2_ctx = turn2.get_span_context()
    assert tool.parent is not None and turn2_ctx is not None and tool.parent.span_id == turn2_ctx.span_id
    assert [link.context.span_id for link in tool.links] == [first_ctx.span_id]
    attrs = dict(tool.attributes or {})
    assert (attrs["gen_ai.tool.call.id"], attrs["gen_ai.agent.name"]) == ("call_1", "codex")
    assert tool.start_time is not None and tool.end_time is not None and tool.start_time <= tool.end_time
    assert b.metric("harnessmesh_harness_tool_seconds_count") == 1
    assert a.metric("harnessmesh_harness_tool_seconds_count") == 0
    (record,) = read_records(b.records_path)
    assert [(r["id"], r["name"]) for r in record["tool_results"]] == [("call_1", "bash")]
    # the call was answered: the trajectory's links now hold turn 2 and no unanswered call
    stored = await kv.get("S/T")
    assert stored is not None and stored.value is not None
    left = decode(stored.value)
    assert left.calls == {} and left.turn is not None and left.turn.span_id == turn2_ctx.span_id


async def test_anonymous_turns_stay_in_the_replica_memory(
    fake_parse: tuple[FakeParse, str], bucket: Any, tmp_path: Path
) -> None:
    fake_parse[0].responder = _responder
    kv = CountingKv(bucket, chunk_size=1 << 20)
    a = Replica(fake_parse[1], kv, tmp_path / "a.jsonl")
    try:
        await _tool_loop(a, a, {})  # no session id: a fresh one per request, nothing to share under
    finally:
        await a.close()
    assert (kv.gets, kv.puts) == (0, 0)
    assert [s.name for s in a.exporter.get_finished_spans() if s.name.startswith("execute_tool")] == \
        ["execute_tool bash"]


async def test_turns_are_served_without_nats(fake_parse: tuple[FakeParse, str], nats_url: str, tmp_path: Path) -> None:
    fake_parse[0].responder = _responder
    nc = await nats.connect(nats_url)
    kv = ChunkedKv(await open_bucket(nc.jetstream(), BucketConfig(f"t_links_{uuid.uuid4().hex[:10]}", ttl=60)),
                   chunk_size=1 << 20)
    await nc.close()  # every read and write now fails: a warning, never a failed request
    a, b = (Replica(fake_parse[1], kv, tmp_path / f"{n}.jsonl") for n in "ab")
    try:
        await _tool_loop(a, b, {"x-session-id": "S2", "x-trajectory-id": "T2"})
    finally:
        await a.close()
        await b.close()
    assert len(a.roots()) == len(b.roots()) == 1 and not b.roots()[0].links


async def test_open_state_connects_to_nats_only_for_jetstream_stores(nats_url: str) -> None:
    memory = await open_state(GatewaySettings(nats_url="nats://127.0.0.1:1"))  # nothing dials the bad URL
    assert memory.nats is None and memory.turn_links is None
    shared = await open_state(GatewaySettings(nats_url=nats_url, turn_links_store="jetstream",
                                              turn_links_bucket=f"t_links_{uuid.uuid4().hex[:10]}"))
    try:
        assert shared.nats is not None and shared.turn_links is not None
        assert type(shared.responses).__name__ == "ResponseStore"  # the Responses store stays in memory
    finally:
        await shared.close()
