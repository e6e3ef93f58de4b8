"""A large request body is validated and converted in a worker thread, so the gateway's event loop serves
other requests meanwhile (issue 14: no single request holds a service's loop for long); a small one is
converted on the loop, where a thread hand-off would cost more than the work."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ValidationError

import gateway.apis.anthropic.endpoint as anthropic_endpoint
import gateway.apis.openai_chat.endpoint as chat_endpoint
import gateway.apis.responses.endpoint as responses_endpoint
import gateway.tokenize_api as tokenize_api
from gateway.apis.anthropic.models import MessagesRequest
from gateway.apis.openai_chat.models import ChatCompletionRequest
from gateway.server import Gateway
from gateway.streaming import VALIDATE_CHUNK, JsonBody, validate_body
from services.common.service_settings import INLINE_BODY_BYTES, INLINE_BODY_MESSAGES
from tests.gateway.fake_parse import FakeParse
from tests.gateway.test_message_limit import bodies, messages

CONVERTERS = {
    "/v1/chat/completions": (chat_endpoint, "chat_request"),
    "/v1/messages": (anthropic_endpoint, "chat_request"),
    "/v1/messages/count_tokens": (anthropic_endpoint, "chat_request"),
    "/v1/responses": (responses_endpoint, "chat_request"),
    "/tokenize": (tokenize_api, "_chat"),
}


@pytest.mark.parametrize("path", sorted(CONVERTERS))
async def test_a_large_body_converts_while_the_loop_serves_others(
    path: str, fake_parse: tuple[FakeParse, str], gateway_factory: Callable[..., Awaitable[Gateway]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module, name = CONVERTERS[path]
    convert = getattr(module, name)
    loop_ran = threading.Event()
    threads: list[threading.Thread] = []

    def converting(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread())
        if threading.current_thread() is not threading.main_thread():
            # the loop is free meanwhile: its ticker sets the event (on the loop this would wait out 5 s)
            assert loop_ran.wait(5), "the event loop did not run while the body was converted"
        return convert(*args, **kwargs)

    monkeypatch.setattr(module, name, converting)
    gateway = await gateway_factory(fake_parse[1])

    async def ticker() -> None:
        while True:
            await asyncio.sleep(0.005)
            if threads:
                loop_ran.set()

    tick = asyncio.create_task(ticker())
    try:
        async with httpx.AsyncClient(base_url=gateway.http_url, timeout=20) as http:
            for n in (2, INLINE_BODY_MESSAGES + 1):
                body, headers = bodies(n)[path]
                response = await http.post(path, json=body, headers=headers)
                assert response.status_code == 200, (path, n, response.text)
    finally:
        tick.cancel()
    assert threads[0] is threading.main_thread()  # small: converted on the loop
    assert threads[1] is not threading.main_thread()


async def test_a_large_malformed_body_is_still_a_400_in_the_apis_shape(
    fake_parse: tuple[FakeParse, str], gateway_factory: Callable[..., Awaitable[Gateway]],
) -> None:
    gateway = await gateway_factory(fake_parse[1])
    padding = "x" * (INLINE_BODY_BYTES + 1)  # validated in a thread
    async with httpx.AsyncClient(base_url=gateway.http_url, timeout=20) as http:
        bad_json = await http.post("/v1/chat/completions", content=b'{"model": "demo", "pad": "' + padding.encode())
        assert bad_json.status_code == 400 and "not valid JSON" in bad_json.json()["error"]["message"]
        invalid = await http.post("/v1/messages", headers={"anthropic-version": "2023-06-01"},
                                  json={"model": "demo", "max_tokens": "many", "messages": [
                                      {"role": "user", "content": padding}]})
        assert invalid.status_code == 400 and invalid.json()["type"] == "error", invalid.text
        body, _ = bodies(INLINE_BODY_MESSAGES + 1)["/v1/chat/completions"]
        ok = await http.post("/v1/chat/completions", json=body)
        assert ok.status_code == 200, ok.text  # the same connection pool: still served


@pytest.mark.parametrize("model", [ChatCompletionRequest, MessagesRequest])
def test_validating_in_chunks_gives_what_one_call_gives(model: type[BaseModel]) -> None:
    raw: dict[str, Any] = {"model": "demo", "max_tokens": 4, "messages": messages(VALIDATE_CHUNK * 2 + 7)}
    whole = model.model_validate(raw)
    assert validate_body(model, JsonBody(raw, large=True, items="messages")) == whole
    bad = {**raw, "messages": [*raw["messages"][:300], {"role": "nobody", "content": 1}, *raw["messages"][300:]]}
    with pytest.raises(ValidationError) as one_call:
        model.model_validate(bad)
    with pytest.raises(ValidationError) as chunked:
        validate_body(model, JsonBody(bad, large=True, items="messages"))
    assert chunked.value.errors()[0]["loc"][:2] == ("messages", 300)
    assert chunked.value.errors() == one_call.value.errors()
