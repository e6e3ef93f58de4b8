"""The root ``gateway.request`` span carries route, model and who-the-request-belongs-to."""

from __future__ import annotations

import httpx
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.app import create_app
from gateway.parse_client import ParseClient
from gateway.settings import GatewaySettings
from services.common.grpc_util import open_channel
from tests.gateway.fake_parse import FakeParse


async def test_request_span(fake_parse: tuple[FakeParse, str]) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    channel = open_channel(fake_parse[1], None)
    app = create_app(ParseClient(channel), GatewaySettings(), provider.get_tracer("t"))
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"x-session-id": "s1", "x-trajectory-id": "t1", "user-agent": "OpenAI/Python 3.54.0"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        response = await http.post("/v1/chat/completions", json=body, headers=headers)
    await channel.close()
    assert response.status_code == 200
    (span,) = exporter.get_finished_spans()
    attrs = dict(span.attributes or {})
    assert span.name == "gateway.request"
    assert attrs["http.route"] == "/v1/chat/completions" and attrs["model"] == "demo"
    assert (attrs["session.id"], attrs["trajectory.id"], attrs["harness.name"]) == ("s1", "t1", "openai-python")
    assert attrs["http.response.status_code"] == 200
