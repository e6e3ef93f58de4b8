"""Tools the model's chat template does not render are never lost silently: a request with tools gets the
``x-harnessmesh-tools-unrendered`` header and the span attribute, on every API; ``/v1/models`` shows the template's
forms; the catalog accepts the keys the parse service reads."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.app import create_app
from gateway.catalog import CatalogError, ModelCatalog
from gateway.parse_client import ParseClient
from gateway.settings import GatewaySettings
from gateway.template_notes import TOOLS_UNRENDERED_ATTRIBUTE, TOOLS_UNRENDERED_HEADER
from gateway.turn_tracking import TurnTracker
from services.api import chat_pb2
from services.common.grpc_util import open_channel
from tests.gateway.fake_parse import FakeParse

TOOL_SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}}
CHAT_TOOL = {"type": "function", "function": {"name": "Bash", "parameters": TOOL_SCHEMA}}
BODIES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {  # path -> (body, its tools)
    "/v1/chat/completions": ({"model": "demo", "messages": [{"role": "user", "content": "hi"}]},
                             {"tools": [CHAT_TOOL]}),
    "/v1/messages": ({"model": "demo", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
                     {"tools": [{"name": "Bash", "input_schema": TOOL_SCHEMA}]}),
    "/v1/responses": ({"model": "demo", "input": "hi"},
                      {"tools": [{"type": "function", "name": "Bash", "parameters": TOOL_SCHEMA}]}),
}


def _unrendered(fake: FakeParse) -> None:
    fake.model = chat_pb2.ModelInfo(
        served_model_name="demo", max_model_len=4096, created=1700000000, inline_system="user",
        inline_system_reason="auto: the template hoists inline system messages", tools_unrendered=True)


@pytest.mark.parametrize("path", sorted(BODIES))
async def test_a_request_with_unrendered_tools_is_marked(fake_parse: tuple[FakeParse, str], path: str) -> None:
    _unrendered(fake_parse[0])
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    channel = open_channel(fake_parse[1], None)
    app = create_app(ParseClient(channel, turns=TurnTracker(tracer)), GatewaySettings(), tracer)
    body, tools = BODIES[path]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        with_tools = await http.post(path, json={**body, **tools})
        without = await http.post(path, json=body)
    await channel.close()
    assert with_tools.status_code == without.status_code == 200, with_tools.text
    assert "does not render tools" in with_tools.headers[TOOLS_UNRENDERED_HEADER]
    assert TOOLS_UNRENDERED_HEADER not in without.headers
    first, second = exporter.get_finished_spans()
    assert dict(first.attributes or {})[TOOLS_UNRENDERED_ATTRIBUTE] is True
    assert TOOLS_UNRENDERED_ATTRIBUTE not in dict(second.attributes or {})


async def test_a_template_that_renders_tools_marks_nothing(fake_parse: tuple[FakeParse, str]) -> None:
    channel = open_channel(fake_parse[1], None)
    app = create_app(ParseClient(channel), GatewaySettings())
    body, tools = BODIES["/v1/chat/completions"]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        response = await http.post("/v1/chat/completions", json={**body, **tools})
    await channel.close()
    assert response.status_code == 200 and TOOLS_UNRENDERED_HEADER not in response.headers


async def test_models_show_the_template_forms(fake_parse: tuple[FakeParse, str]) -> None:
    _unrendered(fake_parse[0])
    channel = open_channel(fake_parse[1], None)
    app = create_app(ParseClient(channel), GatewaySettings())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        listed = (await http.get("/v1/models")).json()["data"][0]
        one = (await http.get("/v1/models/demo")).json()
    await channel.close()
    expected = {"inline_system": "user", "inline_system_reason": "auto: the template hoists inline system messages",
                "renders_tools": False, "tool_prompt": None}
    assert listed["chat_template"] == one["chat_template"] == expected


def test_the_catalog_accepts_the_parse_keys() -> None:
    catalog = ModelCatalog.parse({"models": {"demo": {"inline_system": "user", "tool_prompt_template": "deepseek-r1",
                                                      "unrendered_tools": "refuse", "context_window": 8192}}})
    assert catalog.profile(chat_pb2.ModelInfo(served_model_name="demo", max_model_len=4096)).context_window == 8192
    with pytest.raises(CatalogError, match="unknown keys"):
        ModelCatalog.parse({"models": {"demo": {"inline_systems": "user"}}})
