"""``--model-alias`` with exact names and glob patterns: exact names before patterns, the first matching pattern
wins, the aliases listed by ``/v1/models`` in both shapes, and how a name resolved on the access line and the
request's span (HTTP and the gRPC edge)."""

from __future__ import annotations

import re
from typing import Any

import anthropic
import grpc
import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider, sampling
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.model_aliases import MEMO_LIMIT, ModelAlias, ModelAliases
from gateway.parse_client import ParseClient
from gateway.settings import GatewaySettings
from gateway.turn_tracking import TurnTracker
from services.api import chat_pb2, chat_pb2_grpc
from services.common import errors
from services.common.grpc_util import open_channel
from tests.gateway.fake_parse import FakeParse, batch, finish, started, text, usage

HAIKU = "claude-haiku-4-5-20251001"  # what a Claude Code sub-agent definition may name
HELLO = [{"role": "user", "content": "hi"}]
# A pattern first, an exact name after it, two overlapping patterns: resolution order is not the order given.
ALIASES = ["claude-*=demo", "claude-haiku-*=demo", "mock-model=demo", "gpt-?=demo", "o[134]-mini=demo"]


def _names(aliases: ModelAliases, *requested: str) -> list[str | None]:
    return [(alias.name if (alias := aliases.match(name)) else None) for name in requested]


def test_exact_names_before_patterns_and_the_first_matching_pattern_wins() -> None:
    aliases = ModelAliases.parse([*ALIASES, "claude-sonnet-x=demo"])
    assert aliases.names() == ["mock-model", "claude-sonnet-x", "claude-*", "claude-haiku-*", "gpt-?", "o[134]-mini"]
    assert _names(aliases, "claude-sonnet-x", HAIKU, "claude-opus-4-1", "mock-model") == [
        "claude-sonnet-x", "claude-*", "claude-*", "mock-model"]  # claude-haiku-* comes after claude-*: never used
    assert _names(aliases, "gpt-5", "gpt-55", "o3-mini", "o2-mini", "Claude-x", "xclaude-1", "claude") == [
        "gpt-?", None, "o[134]-mini", None, None, None, None]  # whole name, case-sensitive
    first = ModelAliases.parse(["claude-haiku-*=demo", "claude-*=other", "claude-haiku-*=third"])
    assert aliases.match(HAIKU) == ModelAlias("claude-*", "demo", pattern=True)
    assert first.match(HAIKU) == ModelAlias("claude-haiku-*", "demo", pattern=True)  # a repeated name: the first
    assert [(a.name, a.target) for a in first] == [("claude-haiku-*", "demo"), ("claude-*", "other")]
    built = ModelAliases([ModelAlias("claude-x", "demo"), ModelAlias("claude-*", "demo", pattern=True)])
    assert _names(built, "claude-x", "claude-y", "claude") == ["claude-x", "claude-*", None]


def test_malformed_entries_are_refused_and_the_memo_is_bounded() -> None:
    for bad in ("claude-*", "=demo", "claude-*=", " = "):
        with pytest.raises(ValueError, match="NAME=SERVED"):
            ModelAliases.parse([bad])
    with pytest.raises(ValueError, match="model_alias"):
        GatewaySettings(model_alias=["nope"]).validate()
    aliases = ModelAliases.parse(["claude-*=demo"])
    for i in range(MEMO_LIMIT + 50):  # a client making up names: each one still resolves, the memo stops growing
        assert aliases.match(f"claude-{i}") is not None and aliases.match(f"other-{i}") is None
    assert len(aliases._memo) == MEMO_LIMIT
    assert ModelAliases.coerce({"claude-*": "demo", "x": "demo"}).names() == ["x", "claude-*"]


async def test_a_pattern_serves_a_name_the_harness_made_up(gateway_factory: Any,
                                                          fake_parse: tuple[FakeParse, str]) -> None:
    fake, address = fake_parse
    gw = await gateway_factory(address, model_alias=["claude-*=demo"])
    client = anthropic.AsyncAnthropic(base_url=gw.http_url, api_key="k", max_retries=0)
    message = await client.messages.create(model=HAIKU, max_tokens=8, messages=HELLO)  # type: ignore[arg-type]
    assert message.model == HAIKU  # the client sees the name it asked for
    assert fake.requests[-1].model == "demo"
    async with httpx.AsyncClient(base_url=gw.http_url) as http:
        chat = await http.post("/v1/chat/completions", json={"model": "claude-opus-4-1", "messages": HELLO})
        assert chat.status_code == 200 and chat.json()["model"] == "claude-opus-4-1"
        card = await http.get(f"/v1/models/{HAIKU}")
        assert card.status_code == 200 and card.json()["id"] == HAIKU and card.json()["root"] == "demo"
        unknown = await http.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": HELLO})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["message"] == (
        "The model `gpt-4o` does not exist. This server serves `demo` and the aliases claude-*.")


async def test_an_alias_of_a_model_not_served_is_a_404(fake_parse: tuple[FakeParse, str]) -> None:
    channel = open_channel(fake_parse[1], None)
    parse = ParseClient(channel, aliases=ModelAliases.parse(["claude-*=elsewhere", "mock-model=demo"]))
    assert (await parse.resolve_model("mock-model"))[0] == "mock-model"
    with pytest.raises(errors.NotFoundError, match=re.escape("alias (`claude-*`) of `elsewhere`")):
        await parse.resolve_model(HAIKU)
    await channel.close()


async def test_models_list_shows_the_patterns_in_both_shapes(gateway_factory: Any,
                                                             fake_parse: tuple[FakeParse, str]) -> None:
    gw = await gateway_factory(fake_parse[1], model_alias=ALIASES)
    page = await anthropic.AsyncAnthropic(base_url=gw.http_url, api_key="k", max_retries=0).models.list()
    assert [m.id for m in page.data] == ["demo", "mock-model", "claude-*", "claude-haiku-*", "gpt-?", "o[134]-mini"]
    async with httpx.AsyncClient(base_url=gw.http_url) as http:
        (card,) = (await http.get("/v1/models")).json()["data"]
        one = (await http.get("/v1/models/gpt-5")).json()
    assert card["id"] == "demo" and card["aliases"] == [
        {"name": "mock-model", "pattern": False}, {"name": "claude-*", "pattern": True},
        {"name": "claude-haiku-*", "pattern": True}, {"name": "gpt-?", "pattern": True},
        {"name": "o[134]-mini", "pattern": True}]
    assert one["id"] == "gpt-5" and one["aliases"] == card["aliases"]


def _responder(request: chat_pb2.ChatRequest) -> list[chat_pb2.ChatEventBatch]:
    return [batch(started(40, 16), text("done")), batch(finish(), usage(40, 1, 16))]


@pytest.mark.parametrize("sampler", [sampling.ALWAYS_ON, sampling.ALWAYS_OFF], ids=["sampled", "unsampled"])
async def test_requested_and_resolved_names_on_the_access_line_and_the_span(
        fake_parse: tuple[FakeParse, str], sampler: sampling.Sampler) -> None:
    fake_parse[0].responder = _responder
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    channel = open_channel(fake_parse[1], None)
    parse = ParseClient(channel, turns=TurnTracker(tracer), aliases=ModelAliases.parse(ALIASES))
    app = create_app(parse, GatewaySettings(), tracer)
    with capture_logs() as logs:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            for model in (HAIKU, "mock-model", "demo"):
                body = {"model": model, "max_tokens": 8, "messages": HELLO}
                assert (await http.post("/v1/messages", json=body)).status_code == 200
            assert (await http.post("/v1/messages", json={**body, "model": "nope"})).status_code == 404
    await channel.close()
    lines = [e for e in logs if e["event"] == "gateway.access"]
    assert [(e["status"], e.get("model"), e.get("requested_model"), e.get("model_alias")) for e in lines] == [
        (200, "demo", HAIKU, "claude-*"), (200, "demo", "mock-model", "mock-model"), (200, "demo", "demo", None),
        (404, None, "nope", None)]  # a 404 names what nothing serves: the alias an operator may want
    spans = [dict(s.attributes or {}) for s in exporter.get_finished_spans()]
    if sampler is sampling.ALWAYS_OFF:
        assert spans == []
        return
    assert [(s["harnessmesh.model.requested"], s["harnessmesh.model.resolved"], s.get("harnessmesh.model.alias"),
             s["gen_ai.request.model"]) for s in spans[:3]] == [
        (HAIKU, "demo", "claude-*", "demo"), ("mock-model", "demo", "mock-model", "demo"),
        ("demo", "demo", None, "demo")]


async def test_grpc_edge_access_line_names_the_alias(gateway_factory: Any, fake_parse: tuple[FakeParse, str]) -> None:
    fake, address = fake_parse
    fake.responder = _responder
    gw = await gateway_factory(address, model_alias=["claude-*=demo"])
    user = chat_pb2.Message(role="user", parts=[chat_pb2.Part(text="hi")])
    async with grpc.aio.insecure_channel(gw.grpc_address) as channel:
        stub: Any = chat_pb2_grpc.AgentServiceStub(channel)
        with capture_logs() as logs:
            [_ async for _ in stub.Chat(chat_pb2.ChatRequest(request_id="g1", model=HAIKU, messages=[user]))]
            [_ async for _ in stub.Chat(chat_pb2.ChatRequest(request_id="g2", messages=[user]))]
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                [_ async for _ in stub.Chat(chat_pb2.ChatRequest(request_id="g3", model="gpt-4o", messages=[user]))]
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert fake.requests[-2].model == "demo"
    lines = [e for e in logs if e["event"] == "gateway.access"]
    assert [(e["status"], e.get("model"), e.get("requested_model"), e.get("model_alias")) for e in lines] == [
        ("OK", "demo", HAIKU, "claude-*"), ("OK", "demo", None, None), ("NOT_FOUND", None, "gpt-4o", None)]
