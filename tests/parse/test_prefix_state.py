"""Prefix-watch state shared by parse replicas through JetStream (real nats-server): a session's next turn on
another replica is compared with its last turn; a replica holding the current version reads only the index."""

from __future__ import annotations

import time
import uuid
from array import array
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest

from services.common.jetstream import Blob, BucketConfig, ChunkedKv, open_bucket
from services.parse.prefix_state import JetStreamPrefixState, LocalPrefixState, decode, encode
from services.parse.prefix_watch import History, PrefixWatch
from tests.parse.test_prefix_watch import decode as text

pytestmark = pytest.mark.timeout(60)


class CountingKv(ChunkedKv):
    """A ChunkedKv that remembers what each ``get`` returned (index only or the value)."""

    def __init__(self, kv: Any, **kw: Any) -> None:
        super().__init__(kv, **kw)
        self.reads: list[str] = []

    async def get(self, key: str, *, known: str = "") -> Blob | None:
        blob = await super().get(key, known=known)
        self.reads.append("none" if blob is None else "index" if blob.value is None else "value")
        return blob


@pytest.fixture
async def kv(nats_url: str) -> AsyncIterator[Any]:
    nc = await nats.connect(nats_url)
    yield await open_bucket(nc.jetstream(), BucketConfig(f"t_{uuid.uuid4().hex[:10]}", ttl=60))
    await nc.close()


async def turn(watch: PrefixWatch, state: Any, session: str, prompt: list[int], output: list[int]) -> None:
    """One turn as the service runs it: pull, begin, tokens, commit, push."""
    await state.pull(watch, session)
    started = watch.begin(session, prompt)
    assert started is not None
    started.extend(output)
    started.commit()
    await state.push(watch, session)


def test_histories_encode_round_trip() -> None:
    histories = [History(array("I", [1, 2, 3, 2**32 - 1]), 2), History(array("I"), 0)]
    assert decode(encode(histories)) == histories
    assert decode(encode([])) == []


async def test_a_break_is_found_on_the_replica_that_did_not_run_the_last_turn(kv: Any) -> None:
    a_kv, b_kv = CountingKv(kv, chunk_size=64, inline_max=16), CountingKv(kv, chunk_size=64, inline_max=16)
    a, b = PrefixWatch(text), PrefixWatch(text)
    state_a, state_b = JetStreamPrefixState(a_kv), JetStreamPrefixState(b_kv)
    prompt = list(range(40))  # 160 bytes of tokens: chunked (64-byte chunks)
    await turn(a, state_a, "s", prompt, [100, 101])
    await turn(b, state_b, "s", [*prompt, 100, 101, 102], [103])  # extends a's turn: no break on b
    assert b.breaks == []
    await turn(a, state_a, "s", [*prompt, 100, 101, 102, 103, 104], [])  # a's copy is stale: read through
    assert a.breaks == [] and a_kv.reads == ["none", "value"]
    changed = [0, 1, 99, *prompt[3:], 100, 101, 102, 103, 104, 105]
    await turn(b, state_b, "s", changed, [])  # the header changed on the other replica
    (report,) = b.breaks
    assert report.offset == 2 and report.history_tokens == 45 and not report.in_output
    await turn(b, state_b, "s", [*changed, 106], [])  # b holds the current version: only the index is read
    assert b_kv.reads[-1] == "index" and len(b.breaks) == 1


async def test_sessions_and_trajectories_are_separate_keys(kv: Any) -> None:
    a, b = PrefixWatch(text), PrefixWatch(text)
    state_a, state_b = JetStreamPrefixState(ChunkedKv(kv, chunk_size=1024)), JetStreamPrefixState(
        ChunkedKv(kv, chunk_size=1024))
    await turn(a, state_a, "s", [1, 2, 3], [4])
    await turn(a, state_a, "s/sub", [7, 8, 9], [10])
    await turn(b, state_b, "s/sub", [7, 8, 9, 10, 11], [])
    await turn(b, state_b, "s", [1, 2, 3, 4, 5], [])
    assert b.breaks == []


async def test_nats_down_costs_at_most_the_timeout_and_never_fails(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    kv = await open_bucket(nc.jetstream(), BucketConfig(f"t_{uuid.uuid4().hex[:10]}", ttl=60))
    await nc.close()
    watch = PrefixWatch(text)
    state = JetStreamPrefixState(ChunkedKv(kv, chunk_size=1024), timeout=0.3)
    started = time.monotonic()
    await turn(watch, state, "s", [1, 2, 3], [4])
    assert time.monotonic() - started < 2
    assert watch.histories("s") is not None  # the local copy still works
    skipped = JetStreamPrefixState(ChunkedKv(kv, chunk_size=1024), connected=lambda: False)
    started = time.monotonic()
    await turn(watch, skipped, "s", [1, 2, 3, 4, 5], [])
    assert time.monotonic() - started < 0.5 and watch.breaks == []  # no wait for the 1 s timeout


async def test_local_state_is_the_watch_alone() -> None:
    watch, state = PrefixWatch(text), LocalPrefixState()
    await turn(watch, state, "s", [1, 2], [3])
    await turn(watch, state, "s", [1, 9], [])
    assert len(watch.breaks) == 1
