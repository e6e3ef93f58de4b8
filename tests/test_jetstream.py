"""services.common.jetstream against a real nats-server with JetStream: buckets, chunked values, TTL, size cap."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from nats.js.errors import BadRequestError, BucketNotFoundError

from services.common.jetstream import (
    OPEN_ATTEMPTS,
    STREAM_IN_USE,
    BucketConfig,
    ChunkedKv,
    bucket_name,
    kv_key,
    open_bucket,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Any]:
    conn = await nats.connect(nats_url)
    yield conn
    await conn.close()


def fresh() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


async def test_small_and_chunked_values_round_trip(nc: Any) -> None:
    kv = await open_bucket(nc.jetstream(), BucketConfig(fresh(), ttl=60))
    store = ChunkedKv(kv, chunk_size=1000, inline_max=100)
    assert await store.get("absent") is None
    small = await store.put("s", b"hello")
    assert small.chunks == 0
    big_value = os.urandom(4500)  # incompressible: 5 chunks of at most 1000 bytes
    big = await store.put("session/with spaces/ünïcode", big_value)
    assert big.chunks == 5
    got = await store.get("session/with spaces/ünïcode")
    assert got is not None and got.value == big_value and got.version == big.version
    compressible = b"token " * 5000  # 30 KB that zlib makes well under one chunk
    packed = await store.put("z", compressible)
    assert packed.chunks == 1
    got_z = await store.get("z")
    assert got_z is not None and got_z.value == compressible
    again = await store.get("s")
    assert again is not None and again.value == b"hello"


async def test_a_known_version_reads_only_the_index(nc: Any) -> None:
    kv = await open_bucket(nc.jetstream(), BucketConfig(fresh(), ttl=60))
    store = ChunkedKv(kv, chunk_size=1000, inline_max=0)
    first = await store.put("k", os.urandom(3000))
    unchanged = await store.get("k", known=first.version)
    assert unchanged is not None and unchanged.value is None and unchanged.version == first.version
    second = await store.put("k", b"newer value", replaces=first)
    changed = await store.get("k", known=first.version)
    assert changed is not None and changed.value == b"newer value" and changed.version == second.version
    # the replaced version's chunks are gone
    for i in range(first.chunks):
        with pytest.raises(nats.js.errors.KeyNotFoundError):
            await kv.get(f"{kv_key('k')}.{first.version}.{i}")


async def test_delete_removes_index_and_chunks(nc: Any) -> None:
    kv = await open_bucket(nc.jetstream(), BucketConfig(fresh(), ttl=60))
    store = ChunkedKv(kv, chunk_size=500, inline_max=0)
    blob = await store.put("gone", os.urandom(1200))
    assert await store.delete("gone")
    assert await store.get("gone") is None
    assert not await store.delete("gone")
    with pytest.raises(nats.js.errors.KeyNotFoundError):
        await kv.get(f"{kv_key('gone')}.{blob.version}.0")


async def test_a_value_expires_after_the_bucket_ttl(nc: Any) -> None:
    kv = await open_bucket(nc.jetstream(), BucketConfig(fresh(), ttl=1.0))
    store = ChunkedKv(kv, chunk_size=1000)
    await store.put("short", b"lived")
    assert await store.get("short") is not None
    deadline = asyncio.get_running_loop().time() + 10
    while await store.get("short") is not None:
        assert asyncio.get_running_loop().time() < deadline, "the value outlived the bucket's TTL"
        await asyncio.sleep(0.2)


async def test_a_full_bucket_drops_the_oldest_values_instead_of_refusing(nc: Any) -> None:
    kv = await open_bucket(nc.jetstream(), BucketConfig(fresh(), ttl=60, max_bytes=64 << 10))
    store = ChunkedKv(kv, chunk_size=4000, inline_max=0)
    for i in range(40):  # 40 x ~8 KB incompressible values into a 64 KB bucket: every put succeeds
        await store.put(f"v{i}", os.urandom(8000))
    assert await store.get("v0") is None  # dropped (a missing chunk reads as absent, not as a broken value)
    newest = await store.get("v39")
    assert newest is not None and newest.value is not None and len(newest.value) == 8000


async def test_opening_a_bucket_again_with_new_limits_updates_it(nc: Any) -> None:
    js = nc.jetstream()
    name = fresh()
    await open_bucket(js, BucketConfig(name, ttl=60))
    await open_bucket(js, BucketConfig(name, ttl=120, max_bytes=1 << 20))
    info = await js.stream_info(f"KV_{name}")
    assert info.config.max_age == 120 and info.config.max_bytes == 1 << 20


def test_bucket_names_and_keys() -> None:
    assert bucket_name("", "team a.b", "responses") == "harnessmesh_team_a_b_responses"
    assert bucket_name("mine", "x", "responses") == "mine"
    assert kv_key("s/t") != kv_key("s_t") and "." not in kv_key("a.b")
    with pytest.raises(ValueError):
        kv_key("")


class SettlingJetStream:
    """The JetStream context of a cluster where another replica is creating the same stream: "in use" on
    add, then "not found" from the stream's lookups until its Raft group settles (seen in a 3-node CI run)."""

    def __init__(self, unsettled: int) -> None:
        self.unsettled = unsettled
        self.lookups = 0

    async def add_stream(self, config: Any) -> None:
        raise BadRequestError(code=400, err_code=STREAM_IN_USE, description="stream name already in use")

    async def update_stream(self, config: Any) -> None:
        return None

    async def key_value(self, name: str) -> str:
        self.lookups += 1
        if self.lookups <= self.unsettled:
            raise BucketNotFoundError(code=404, err_code=10059, description="stream not found")
        return f"bucket {name}"


async def test_a_stream_another_replica_is_creating_opens_once_it_settles() -> None:
    js = SettlingJetStream(unsettled=3)
    assert await open_bucket(js, BucketConfig("b", ttl=60)) == "bucket b"
    assert js.lookups == 4


async def test_a_stream_that_never_appears_fails_after_bounded_retries() -> None:
    js = SettlingJetStream(unsettled=10_000)
    with pytest.raises(BucketNotFoundError):
        await open_bucket(js, BucketConfig("b", ttl=60))
    assert js.lookups == OPEN_ATTEMPTS
