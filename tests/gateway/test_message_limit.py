"""``--max-messages`` at the gateway: a body with more messages (Responses API: input items) than the limit is a
400 in its API's shape naming the field, before it is validated or converted (that work runs on the event loop,
~18 us a message), nothing reaches the parse service, and the connection serves the next request."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from gateway.server import Gateway
from tests.gateway.fake_parse import FakeParse

LIMIT = 5
ANTHROPIC = {"anthropic-version": "2023-06-01"}


def messages(n: int) -> list[dict[str, str]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(n)]


def bodies(n: int) -> dict[str, tuple[dict[str, Any], dict[str, str]]]:
    return {
        "/v1/chat/completions": ({"model": "demo", "max_tokens": 4, "messages": messages(n)}, {}),
        "/v1/messages": ({"model": "demo", "max_tokens": 4, "messages": messages(n)}, ANTHROPIC),
        "/v1/messages/count_tokens": ({"model": "demo", "messages": messages(n)}, ANTHROPIC),
        "/v1/responses": ({"model": "demo", "max_output_tokens": 4,
                           "input": [{"role": "user", "content": m["content"]} for m in messages(n)]}, {}),
        "/tokenize": ({"model": "demo", "messages": messages(n)}, {}),
    }


async def test_more_messages_than_the_limit_are_a_400_in_each_api_shape_before_parse_sees_them(
    fake_parse: tuple[FakeParse, str], gateway_factory: Callable[..., Awaitable[Gateway]],
) -> None:
    parse, address = fake_parse
    gateway = await gateway_factory(address, max_messages=LIMIT)
    async with httpx.AsyncClient(base_url=gateway.http_url, timeout=10) as http:
        for path, (body, headers) in bodies(LIMIT + 1).items():
            response = await http.post(path, json=body, headers=headers)
            assert response.status_code == 400, (path, response.text)
            field = "input" if path == "/v1/responses" else "messages"
            if path.startswith("/v1/messages"):
                error = response.json()["error"]
                assert response.json()["type"] == "error" and error["type"] == "invalid_request_error"
            else:
                error = response.json()["error"]
                assert error["param"] == field
            assert f"{field} has {LIMIT + 1} items; at most {LIMIT}" in error["message"]
            assert "--max-messages" in error["message"]
        assert not parse.requests  # refused before any of it was converted or sent
        ok = await http.post("/v1/chat/completions", json=bodies(LIMIT)["/v1/chat/completions"][0])
        assert ok.status_code == 200, ok.text  # the same connection pool: still served


async def test_zero_means_no_limit(
    fake_parse: tuple[FakeParse, str], gateway_factory: Callable[..., Awaitable[Gateway]],
) -> None:
    gateway = await gateway_factory(fake_parse[1], max_messages=0)
    async with httpx.AsyncClient(base_url=gateway.http_url, timeout=10) as http:
        body, _ = bodies(LIMIT * 4)["/v1/chat/completions"]
        assert (await http.post("/v1/chat/completions", json=body)).status_code == 200
