"""OpenAI-shaped errors: statuses before the first byte, in-band SSE errors after it."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import httpx
import openai
import pytest

from gateway.apis.openai_chat.errors import error_body
from gateway.server import Gateway
from services.api import common_pb2
from services.common import errors
from tests.gateway.fake_parse import FakeParse, batch, error, started, text

MESSAGES: Any = [{"role": "user", "content": "hi"}]


async def _post(gateway: Gateway, body: object) -> httpx.Response:
    async with httpx.AsyncClient() as http:
        return await http.post(gateway.http_url + "/v1/chat/completions", json=body)


def _assert_shape(payload: dict[str, object]) -> dict[str, object]:
    err = payload["error"]
    assert isinstance(err, dict)
    assert set(err) == {"message", "type", "param", "code"}
    return err


async def test_malformed_body_names_the_field(gateway: Gateway) -> None:
    response = await _post(gateway, {"model": "demo", "messages": [{"role": "user", "content": 5}]})
    assert response.status_code == 400
    err = _assert_shape(response.json())
    assert err["type"] == "invalid_request_error"
    assert err["param"] == "messages[0].content"


async def test_missing_messages_and_bad_json(gateway: Gateway) -> None:
    response = await _post(gateway, {"model": "demo"})
    assert response.status_code == 400 and _assert_shape(response.json())["param"] == "messages"
    async with httpx.AsyncClient() as http:
        response = await http.post(gateway.http_url + "/v1/chat/completions", content=b"{not json")
    assert response.status_code == 400 and _assert_shape(response.json())["type"] == "invalid_request_error"


async def test_bad_tool_choice_and_content_part(gateway: Gateway) -> None:
    body = {"model": "demo", "messages": MESSAGES, "tool_choice": {"type": "function", "function": {"name": "x"}}}
    response = await _post(gateway, body)
    assert response.status_code == 400 and _assert_shape(response.json())["param"] == "tool_choice"
    image = {"type": "image_url", "image_url": {"url": "data:"}}
    response = await _post(gateway, {"model": "demo", "messages": [{"role": "user", "content": [image]}]})
    assert response.status_code == 400 and _assert_shape(response.json())["param"] == "messages[0].content[0].type"


async def test_unknown_model_is_404(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        await client.chat.completions.create(model="nope", messages=MESSAGES)
    assert info.value.status_code == 404
    body = info.value.body
    assert isinstance(body, dict)
    assert body["code"] == "model_not_found" and body["type"] == "not_found_error" and body["param"] == "model"


async def test_parse_down_is_503(gateway_factory: Callable[..., Awaitable[Gateway]], dead_address: str) -> None:
    gateway = await gateway_factory(dead_address)
    client = openai.AsyncOpenAI(base_url=gateway.http_url + "/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.InternalServerError) as info:
        await client.chat.completions.create(model="demo", messages=MESSAGES)
    assert info.value.status_code == 503
    assert isinstance(info.value.body, dict) and info.value.body["type"] == "service_unavailable"


async def test_parse_abort_before_first_frame_keeps_status(gateway: Gateway, fake: FakeParse) -> None:
    fake.abort = (grpc.StatusCode.UNAVAILABLE, "no worker")
    response = await _post(gateway, {"model": "demo", "messages": MESSAGES, "stream": True})
    assert response.status_code == 503
    assert _assert_shape(response.json())["message"] == "no worker"
    fake.abort = (grpc.StatusCode.OUT_OF_RANGE, "prompt too long")
    response = await _post(gateway, {"model": "demo", "messages": MESSAGES})
    assert response.status_code == 400
    assert _assert_shape(response.json())["code"] == "context_length_exceeded"


async def test_error_in_first_frame_is_an_http_status(gateway: Gateway, fake: FakeParse) -> None:
    fake.script = [batch(error(common_pb2.ERROR_CODE_UNAVAILABLE, "no worker"))]
    response = await _post(gateway, {"model": "demo", "messages": MESSAGES, "stream": True})
    assert response.status_code == 503


async def test_in_band_error_after_stream_start(client: openai.AsyncOpenAI, gateway: Gateway, fake: FakeParse) -> None:
    fake.script = [batch(started(), text("par")), batch(error(common_pb2.ERROR_CODE_INTERNAL, "worker died"))]
    response = await _post(gateway, {"model": "demo", "messages": MESSAGES, "stream": True})
    assert response.status_code == 200
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    err = _assert_shape(json.loads(events[-2]))
    # An internal error names the request, never what went wrong inside (that is logged with the same id).
    completion_id = json.loads(events[0])["id"]
    assert err["message"] == f"internal error (request id: {completion_id})" and err["type"] == "server_error"
    stream = await client.chat.completions.create(model="demo", messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIError, match=r"internal error \(request id: chatcmpl-"):
        async for _ in stream:
            pass


async def test_internal_errors_name_the_request_not_the_cause(gateway: Gateway, fake: FakeParse) -> None:
    fake.abort = (grpc.StatusCode.INTERNAL, "KeyError: 'secret detail'")
    for stream in (False, True):
        response = await _post(gateway, {"model": "demo", "messages": MESSAGES, "stream": stream})
        assert response.status_code == 500
        err = _assert_shape(response.json())
        assert err["type"] == "server_error" and "secret" not in response.text
        assert str(err["message"]).startswith("internal error (request id: chatcmpl-")
    async with httpx.AsyncClient() as http:
        response = await http.post(gateway.http_url + "/v1/messages", json={
            "model": "demo", "max_tokens": 8, "messages": MESSAGES})
    assert response.status_code == 500 and "secret" not in response.text
    body = response.json()
    assert body["error"]["message"] == f"internal error (request id: {body['request_id']})"
    assert body["request_id"].startswith("msg_")


async def test_non_stream_in_band_error_becomes_status(gateway: Gateway, fake: FakeParse) -> None:
    fake.script = [batch(started(), text("x")), batch(error(common_pb2.ERROR_CODE_UNAVAILABLE, "gone"))]
    response = await _post(gateway, {"model": "demo", "messages": MESSAGES})
    assert response.status_code == 503


async def test_unknown_route_is_openai_shaped(gateway: Gateway) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.get(gateway.http_url + "/v1/nothing")
    assert response.status_code == 404
    _assert_shape(response.json())


def test_error_body_categories() -> None:
    cases = {
        errors.InvalidRequestError("x"): "invalid_request_error",
        errors.NotFoundError("x"): "not_found_error",
        errors.UnavailableError("x"): "service_unavailable",
        errors.UnauthenticatedError("x"): "authentication_error",
        errors.InternalError("x"): "server_error",
    }
    for err, kind in cases.items():
        assert error_body(err)["error"]["type"] == kind


async def test_api_key(gateway_factory: Callable[..., Awaitable[Gateway]], fake_parse: tuple[FakeParse, str]) -> None:
    gateway = await gateway_factory(fake_parse[1], api_key=["sk-right"])
    wrong = openai.AsyncOpenAI(base_url=gateway.http_url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await wrong.models.list()
    right = openai.AsyncOpenAI(base_url=gateway.http_url + "/v1", api_key="sk-right", max_retries=0)
    assert [m.id async for m in right.models.list()] == ["demo"]
    async with httpx.AsyncClient() as http:
        assert (await http.get(gateway.http_url + "/health")).status_code == 200


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {}}}, "tool_choice.function.name"),
        ({"messages": [{"role": "bogus", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"text": "a"}]}]}, "messages[0].content[0].type"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 2}, "n"),
    ],
)
async def test_validation_param(gateway: Gateway, patch: dict[str, object], param: str) -> None:
    response = await _post(gateway, {"model": "demo", "messages": MESSAGES, **patch})
    assert response.status_code == 400
    assert _assert_shape(response.json())["param"] == param
