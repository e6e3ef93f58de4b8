"""An unexpected exception in a handler is a 500 in the API's shape, and the keep-alive connection it came on
keeps serving (the issue-14 rule: an internal failure drops no connection)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from gateway.apis.openai_chat import endpoint
from gateway.server import Gateway
from tests.gateway.fake_parse import FakeParse

BODY = {"model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


async def test_an_unexpected_exception_is_a_500_in_shape_and_the_connection_stays_usable(
    fake_parse: tuple[FakeParse, str], gateway_factory: Callable[..., Awaitable[Gateway]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gateway = await gateway_factory(fake_parse[1])
    real = endpoint.chat_request  # type: ignore[attr-defined]
    calls = {"n": 0}

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("a bug")
        return real(*args, **kwargs)

    monkeypatch.setattr(endpoint, "chat_request", flaky)
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(base_url=gateway.http_url, timeout=10, limits=limits) as http:
        failed = await http.post("/v1/chat/completions", json=BODY)
        assert failed.status_code == 500
        error = failed.json()["error"]
        assert error["type"] == "server_error" and "request id" in error["message"] and "a bug" not in str(error)
        served = await http.post("/v1/chat/completions", json=BODY)
        assert served.status_code == 200, served.text
        assert local_port(served) == local_port(failed)  # the same connection: it was not dropped


def local_port(response: httpx.Response) -> int:
    port: int = response.extensions["network_stream"].get_extra_info("client_addr")[1]
    return port
