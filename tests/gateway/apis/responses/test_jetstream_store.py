"""The Responses store in JetStream (real nats-server): encoding, chunking, the size cap, and two gateways
sharing one bucket (``previous_response_id``, GET and DELETE on either); GET / DELETE in memory too."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import nats.js.errors
import openai
import pytest

from gateway.apis.responses.jetstream_store import JetStreamResponseStore, decode, encode
from gateway.apis.responses.store import StoredResponse
from gateway.server import Gateway
from services.api import chat_pb2
from services.common import errors
from services.common.jetstream import BucketConfig, ChunkedKv, open_bucket
from tests.gateway.apis.responses.test_endpoint import WEATHER, answer_turn, tool_turn
from tests.gateway.fake_parse import FakeParse

pytestmark = pytest.mark.timeout(60)
Factory = Callable[..., Awaitable[Gateway]]


def conversation() -> list[chat_pb2.Message]:
    return [chat_pb2.Message(role="user", parts=[chat_pb2.Part(text="Weather?")]),
            chat_pb2.Message(role="assistant", parts=[chat_pb2.Part(reasoning="need weather")])]


def test_encoding_round_trips() -> None:
    stored = StoredResponse(tuple(conversation()), {"id": "resp_1", "output": [{"type": "message"}], "n": 1.5})
    assert decode(encode(stored)) == stored
    empty = StoredResponse((), {"id": "resp_2"})
    assert decode(encode(empty)) == empty


async def test_a_large_response_is_chunked_and_one_over_the_cap_is_not_stored(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        bucket = f"t_{uuid.uuid4().hex[:10]}"
        kv = await open_bucket(nc.jetstream(), BucketConfig(bucket, ttl=60))
        store = JetStreamResponseStore(ChunkedKv(kv, chunk_size=2048), bucket=bucket, ttl=60, max_bytes=200_000)
        big = {"id": "resp_big", "output": [{"type": "message", "text": uuid.uuid4().hex * 2000}]}  # 64 KB
        await store.put("resp_big", conversation(), big)
        got = await store.get("resp_big")
        assert got is not None and got.response == big and list(got.conversation) == conversation()
        huge = {"id": "resp_huge", "text": uuid.uuid4().hex * 20_000}  # 640 KB > max_bytes
        await store.put("resp_huge", [], huge)
        assert await store.get("resp_huge") is None
        assert await store.delete("resp_big") and await store.get("resp_big") is None
        assert "JetStream bucket " + bucket in store.where
    finally:
        await nc.close()


async def test_nats_gone_is_unavailable(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    bucket = f"t_{uuid.uuid4().hex[:10]}"
    kv = await open_bucket(nc.jetstream(), BucketConfig(bucket, ttl=60))
    store = JetStreamResponseStore(ChunkedKv(kv, chunk_size=2048), bucket=bucket, ttl=60, max_bytes=-1, timeout=1)
    await nc.close()
    with pytest.raises(errors.UnavailableError):
        await store.get("resp_x")


async def test_two_gateways_share_one_conversation(gateway_factory: Factory, fake_parse: tuple[FakeParse, str],
                                                   nats_url: str) -> None:
    fake, address = fake_parse
    bucket = f"t_{uuid.uuid4().hex[:10]}"
    opts: dict[str, Any] = {"responses_store": "jetstream", "nats_url": nats_url, "responses_store_bucket": bucket}
    a, b = await gateway_factory(address, **opts), await gateway_factory(address, **opts)
    ca, cb = (openai.AsyncOpenAI(base_url=g.http_url + "/v1", api_key="k", max_retries=0, timeout=10) for g in (a, b))
    fake.script = tool_turn()
    first = await ca.responses.create(model="demo", input="Weather in Paris?", tools=WEATHER, stream=True)
    completed: Any = [e async for e in first][-1]
    call = completed.response.output[1]
    fake.script = answer_turn(cached=16)
    second = await cb.responses.create(  # the other replica, right after the first stream ended
        model="demo", previous_response_id=completed.response.id, tools=WEATHER,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "22 degrees"}])
    assert second.output_text == "It is sunny."
    assert [m.role for m in fake.requests[-1].messages] == ["user", "assistant", "tool"]
    assert (await cb.responses.retrieve(completed.response.id)).id == completed.response.id
    assert (await ca.responses.retrieve(second.id)).output_text == "It is sunny."
    await ca.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        await cb.responses.retrieve(second.id)
    with pytest.raises(openai.NotFoundError):
        await cb.responses.delete(second.id)


async def test_get_and_delete_in_memory(client: openai.AsyncOpenAI, fake: FakeParse) -> None:
    fake.script = answer_turn(cached=0)
    first = await client.responses.create(model="demo", input="hi")
    got = await client.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == "It is sunny." and got.status == "completed"
    await client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError) as info:
        await client.responses.retrieve(first.id)
    assert "in memory" in str(info.value)


class _FailingKv:
    """A bucket that answers as a JetStream cluster electing a new leader does, ``failures`` times."""

    def __init__(self, failures: int, inner: ChunkedKv | None = None) -> None:
        self.failures = failures
        self.calls = 0
        self.inner = inner

    async def get(self, key: str) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            raise nats.js.errors.NoStreamResponseError()
        return None if self.inner is None else await self.inner.get(key)


async def test_a_leader_election_is_waited_out() -> None:
    kv = _FailingKv(failures=3)
    store = JetStreamResponseStore(kv, bucket="b", ttl=60, max_bytes=-1, retry_for=5)  # type: ignore[arg-type]
    assert await store.get("resp_x") is None
    assert kv.calls == 4


async def test_a_failover_that_lasts_is_unavailable() -> None:
    kv = _FailingKv(failures=10**6)
    store = JetStreamResponseStore(kv, bucket="b", ttl=60, max_bytes=-1, retry_for=0.5)  # type: ignore[arg-type]
    with pytest.raises(errors.UnavailableError, match="NoStreamResponseError"):
        await store.get("resp_x")
    assert 2 <= kv.calls <= 6
