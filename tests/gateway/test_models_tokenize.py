"""Models, health, readiness, and vLLM-compatible tokenize/detokenize."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import httpx
import openai

from gateway.server import Gateway
from services.api import parse_pb2
from tests.gateway.fake_parse import FakeParse


async def test_models(client: openai.AsyncOpenAI, gateway: Gateway) -> None:
    models = [m async for m in client.models.list()]
    assert [(m.id, m.object, m.created) for m in models] == [("demo", "model", 1700000000)]
    model = await client.models.retrieve("demo")
    assert model.id == "demo"
    async with httpx.AsyncClient() as http:
        response = await http.get(gateway.http_url + "/v1/models/other")
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"


async def test_served_model_name_override(
    gateway_factory: Callable[..., Awaitable[Gateway]], fake_parse: tuple[FakeParse, str]
) -> None:
    fake, address = fake_parse
    gateway = await gateway_factory(address, served_model_name="public-name")
    client = openai.AsyncOpenAI(base_url=gateway.http_url + "/v1", api_key="k", max_retries=0)
    assert [m.id async for m in client.models.list()] == ["public-name"]
    completion = await client.chat.completions.create(
        model="public-name", messages=[{"role": "user", "content": "hi"}]
    )
    assert completion.model == "public-name"
    assert fake.requests[0].model == "demo"


async def test_health_and_ready(
    gateway: Gateway, gateway_factory: Callable[..., Awaitable[Gateway]], dead_address: str
) -> None:
    async with httpx.AsyncClient() as http:
        assert (await http.get(gateway.http_url + "/health")).status_code == 200
        ready = await http.get(gateway.http_url + "/ready")
        assert ready.status_code == 200 and ready.json()["model"] == "demo"
        down = await gateway_factory(dead_address)
        assert (await http.get(down.http_url + "/health")).status_code == 200
        not_ready = await http.get(down.http_url + "/ready")
        assert not_ready.status_code == 503
        assert not_ready.json()["error"]["type"] == "service_unavailable"


async def test_ready_is_503_with_the_reason_while_no_worker_is_routable(gateway: Gateway, fake: FakeParse) -> None:
    fake.readiness = parse_pb2.ReadyResponse(ready=False, reason="no worker is routable (none has a live heartbeat)")
    async with httpx.AsyncClient() as http:
        not_ready = await http.get(gateway.http_url + "/ready")
        assert not_ready.status_code == 503 and "no worker is routable" in not_ready.json()["error"]["message"]
        assert (await http.get(gateway.http_url + "/health")).status_code == 200  # liveness is unaffected
        fake.readiness = parse_pb2.ReadyResponse(ready=True, workers=2)
        ready = await http.get(gateway.http_url + "/ready")
        assert ready.status_code == 200 and ready.json()["workers"] == 2


async def test_tokenize_messages_uses_chat_conversion(gateway: Gateway, fake: FakeParse) -> None:
    body = {
        "model": "demo",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "par", "reasoning_content": "r"},
        ],
        "add_generation_prompt": False,
        "continue_final_message": True,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "chat_template_kwargs": {"enable_thinking": True},
    }
    async with httpx.AsyncClient() as http:
        response = await http.post(gateway.http_url + "/tokenize", json=body)
    assert response.json() == {"tokens": [1, 2, 3], "count": 3, "max_model_len": 4096}
    chat = fake.tokenize_requests[0].chat
    assert [p.WhichOneof("kind") for p in chat.messages[1].parts] == ["reasoning", "text"]
    assert chat.continue_final_message and not chat.add_generation_prompt
    assert chat.tools[0].name == "f" and chat.model == "demo"
    assert json.loads(chat.chat_template_kwargs_json) == {"enable_thinking": True}


async def test_tokenize_defaults_add_generation_prompt(gateway: Gateway, fake: FakeParse) -> None:
    async with httpx.AsyncClient() as http:
        await http.post(gateway.http_url + "/tokenize", json={"messages": [{"role": "user", "content": "x"}]})
    assert fake.tokenize_requests[0].chat.add_generation_prompt


async def test_tokenize_prompt_and_detokenize(gateway: Gateway, fake: FakeParse) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.post(
            gateway.http_url + "/tokenize", json={"model": "demo", "prompt": "abc", "add_special_tokens": False}
        )
        assert response.json()["count"] == 3
        request = fake.tokenize_requests[0]
        assert request.prompt == "abc" and not request.add_special_tokens
        response = await http.post(gateway.http_url + "/detokenize", json={"model": "demo", "tokens": [5, 6]})
        assert response.json() == {"prompt": "hello"}
        assert list(fake.detokenize_requests[0].token_ids) == [5, 6]
        bad = await http.post(gateway.http_url + "/detokenize", json={"tokens": [-1]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens[0]"
        unknown = await http.post(gateway.http_url + "/tokenize", json={"model": "zzz", "prompt": "a"})
        assert unknown.status_code == 404
