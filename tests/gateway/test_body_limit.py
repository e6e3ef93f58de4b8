"""``--max-request-bytes``: a body over the limit gets 413 in its API's shape before it is read past the
limit (declared by Content-Length, or counted while a chunked body streams), and the connection stays usable."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx

from gateway.server import Gateway
from tests.gateway.fake_parse import FakeParse

LIMIT = 64 * 1024


def body(size: int) -> bytes:
    return json.dumps({"model": "demo", "max_tokens": 4,
                       "messages": [{"role": "user", "content": "x" * size}]}).encode()


async def chunks(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 8192):
        yield data[i:i + 8192]


async def test_an_oversized_body_is_413_in_each_api_shape_and_the_connection_stays_usable(
    fake_parse: tuple[FakeParse, str], gateway_factory: Callable[..., Awaitable[Gateway]],
) -> None:
    gateway = await gateway_factory(fake_parse[1], max_request_bytes=LIMIT)
    async with httpx.AsyncClient(timeout=10) as http:
        big = await http.post(gateway.http_url + "/v1/chat/completions", content=body(LIMIT),
                              headers={"content-type": "application/json"})
        assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
        anthropic = await http.post(gateway.http_url + "/v1/messages", content=body(LIMIT),
                                    headers={"content-type": "application/json", "anthropic-version": "2023-06-01"})
        assert anthropic.status_code == 413 and anthropic.json()["error"]["type"] == "request_too_large"
        small = await http.post(gateway.http_url + "/v1/chat/completions", content=body(100),
                                headers={"content-type": "application/json"})
        assert small.status_code == 200  # same client, same connection pool: still served


async def test_a_chunked_body_is_cut_off_once_it_passes_the_limit(
    fake_parse: tuple[FakeParse, str], gateway_factory: Callable[..., Awaitable[Gateway]],
) -> None:
    gateway = await gateway_factory(fake_parse[1], max_request_bytes=LIMIT)
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.post(gateway.http_url + "/v1/chat/completions",
                                   content=chunks(body(LIMIT * 4)),
                                   headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert not fake_parse[0].requests  # nothing reached the parse service
