"""``AdmissionGate``: with the queue full, a chat turn is refused at the door, before its body is read or parsed,
in its API's shape with ``retry-after``; the connection stays usable; a request without a valid key gets its 401."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import httpx
import pytest

from gateway.server import Gateway
from tests.gateway.fake_parse import FakeParse

pytestmark = pytest.mark.timeout(20)

BODY = {"model": "demo", "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def port_of(response: httpx.Response) -> int:
    return int(response.extensions["network_stream"].get_extra_info("client_addr")[1])


async def hold_the_slot(http: httpx.AsyncClient, gateway: Gateway, fake: FakeParse) -> asyncio.Task[None]:
    """A streaming turn that holds the one slot until cancelled."""
    async def stream() -> None:
        async with http.stream("POST", gateway.http_url + "/v1/chat/completions", json=BODY,
                               headers={"authorization": "Bearer k"}) as response:
            async for _ in response.aiter_lines():
                pass

    task = asyncio.create_task(stream())
    await asyncio.wait_for(fake.chat_started.wait(), 5)  # the slot is taken before the parse call starts
    assert gateway.parse.admission.active == 1
    return task


async def test_a_full_queue_refuses_at_the_door_in_each_api_shape_and_the_connection_stays_usable(
    fake_parse: tuple[FakeParse, str], gateway_factory: Callable[..., Awaitable[Gateway]],
) -> None:
    fake = fake_parse[0]
    fake.hang = True
    gateway = await gateway_factory(fake_parse[1], max_concurrent_requests=1, max_queued_requests=0,
                                    api_key=["k"])
    async with httpx.AsyncClient(timeout=10) as holder, httpx.AsyncClient(
            timeout=10, limits=httpx.Limits(max_connections=1)) as http:
        slot = await hold_the_slot(holder, gateway, fake)
        auth = {"authorization": "Bearer k", "content-type": "application/json"}
        # not JSON, and large: refused before it is read or parsed (a parsed body would be a 400)
        refused = await http.post(gateway.http_url + "/v1/chat/completions", content=b"{" * 300_000, headers=auth)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["type"] == "rate_limit_error" and int(refused.headers["retry-after"]) >= 1
        anthropic = await http.post(gateway.http_url + "/v1/messages", content=json.dumps(BODY),
                                    headers={**auth, "anthropic-version": "2023-06-01"})
        assert anthropic.status_code == 529 and anthropic.json()["error"]["type"] == "overloaded_error"
        assert "retry-after" in anthropic.headers
        unauthenticated = await http.post(gateway.http_url + "/v1/chat/completions", json=BODY)
        assert unauthenticated.status_code == 401
        assert len(fake.requests) == 1 and gateway.parse.admission.refused == 2
        slot.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slot
        await asyncio.wait_for(fake.cancelled.wait(), 5)  # the slot is given back before the parse call ends
        assert gateway.parse.admission.active == 0
        fake.hang = False
        served = await http.post(gateway.http_url + "/v1/chat/completions", json={**BODY, "stream": False},
                                 headers=auth)
        assert served.status_code == 200, served.text
        assert port_of(served) == port_of(refused) == port_of(anthropic)  # one connection, after two unread bodies
