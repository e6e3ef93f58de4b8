from __future__ import annotations

from collections.abc import AsyncIterator

import openai
import pytest

from gateway.server import Gateway
from gateway.settings import GatewaySettings
from services.launcher.supervisor import free_port
from tests.gateway.fake_parse import FakeParse, start_fake_parse


@pytest.fixture
async def fake_parse() -> AsyncIterator[tuple[FakeParse, str]]:
    fake = FakeParse()
    server, address = await start_fake_parse(fake)
    yield fake, address
    await server.stop(0)


@pytest.fixture
def fake(fake_parse: tuple[FakeParse, str]) -> FakeParse:
    return fake_parse[0]


async def _gateway(address: str, **overrides: object) -> Gateway:
    settings = GatewaySettings(host="127.0.0.1", http_port=0, grpc_port=0, parse_address=address, **overrides)  # type: ignore[arg-type]
    gateway = Gateway(settings, tracing=None)
    await gateway.start()
    return gateway


@pytest.fixture
async def gateway(fake_parse: tuple[FakeParse, str]) -> AsyncIterator[Gateway]:
    gw = await _gateway(fake_parse[1])
    yield gw
    await gw.stop()


@pytest.fixture
async def gateway_factory() -> AsyncIterator[object]:
    started: list[Gateway] = []

    async def make(address: str, **overrides: object) -> Gateway:
        gw = await _gateway(address, **overrides)
        started.append(gw)
        return gw

    yield make
    for gw in started:
        await gw.stop()


@pytest.fixture
def client(gateway: Gateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.http_url + "/v1", api_key="sk-test", max_retries=0, timeout=10)


@pytest.fixture
def dead_address() -> str:
    """An address nothing listens on."""
    return f"127.0.0.1:{free_port()}"  # handed out once: no later free_port gives it to a server
