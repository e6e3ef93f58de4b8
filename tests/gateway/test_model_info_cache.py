"""The gateway's cached model info: a request past the TTL does not wait for ``GetModel``; one far past it does."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gateway.parse_client import STALE_LIMIT, ParseClient
from tests.gateway.fake_parse import FakeParse

TTL = 0.05


async def test_a_request_past_the_ttl_gets_the_cached_info_while_it_is_fetched_again(
    fake_parse: tuple[FakeParse, str],
) -> None:
    fake, address = fake_parse
    async with grpc.aio.insecure_channel(address) as channel:
        parse = ParseClient(channel, model_ttl=TTL)
        assert (await parse.resolve_model(""))[0] == "demo" and fake.get_model_calls == 1
        assert (await parse.resolve_model("demo"))[0] == "demo" and fake.get_model_calls == 1  # cached

        await asyncio.sleep(TTL * 2)
        fake.model_gate = asyncio.Event()  # GetModel now hangs until released
        fake.model.served_model_name = "renamed"
        public, _ = await asyncio.wait_for(parse.resolve_model(""), timeout=2)  # not held up by the fetch
        assert public == "demo"
        await asyncio.wait_for(parse.resolve_model(""), timeout=2)
        for _ in range(200):  # the background fetch reached the server (one, however many requests)
            if fake.get_model_calls == 2:
                break
            await asyncio.sleep(0.005)
        assert fake.get_model_calls == 2

        fake.model_gate.set()
        for _ in range(200):
            if (await parse.resolve_model(""))[0] == "renamed":
                break
            await asyncio.sleep(0.005)
        assert (await parse.resolve_model(""))[0] == "renamed"
        # the non-request probes still ask for fresh info
        assert (await parse.get_model(fresh=True)).served_model_name == "renamed"


async def test_info_too_old_is_waited_for(fake_parse: tuple[FakeParse, str]) -> None:
    fake, address = fake_parse
    async with grpc.aio.insecure_channel(address) as channel:
        parse = ParseClient(channel, model_ttl=TTL)
        await parse.resolve_model("")
        await asyncio.sleep(TTL * STALE_LIMIT + 0.05)
        fake.model_gate = asyncio.Event()
        fake.model.served_model_name = "renamed"
        waiting = asyncio.ensure_future(parse.resolve_model(""))
        await asyncio.sleep(0.1)
        assert not waiting.done()  # too stale to answer: it waits for GetModel
        fake.model_gate.set()
        assert (await asyncio.wait_for(waiting, timeout=2))[0] == "renamed"


async def test_a_failed_background_fetch_keeps_the_cached_info(fake_parse: tuple[FakeParse, str]) -> None:
    fake, address = fake_parse
    async with grpc.aio.insecure_channel(address) as channel:
        parse = ParseClient(channel, model_ttl=TTL)
        await parse.resolve_model("")
        await asyncio.sleep(TTL * 2)
        fake.model_error = grpc.StatusCode.UNAVAILABLE
        assert (await parse.resolve_model(""))[0] == "demo"
        for _ in range(200):
            if fake.get_model_calls == 2:
                break
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)  # the fetch failed (logged) and left the cached info alone
        assert fake.get_model_calls == 2
        assert (await parse.resolve_model(""))[0] == "demo"
        with pytest.raises(Exception, match="GetModel fails"):
            await parse.get_model(fresh=True)  # a probe that asks for fresh info still sees the failure


async def test_fresh_never_answers_from_the_cache(fake_parse: tuple[FakeParse, str]) -> None:
    fake, address = fake_parse
    async with grpc.aio.insecure_channel(address) as channel:
        parse = ParseClient(channel, model_ttl=60)
        await parse.get_model()
        await parse.get_model(fresh=True)
        assert fake.get_model_calls == 2
