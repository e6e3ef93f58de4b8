"""Prompt reuse across a hop (``services.common.prompt_reuse``): a session's next prompt travels as a tail
and the receiver rebuilds exactly the whole prompt, or refuses and gets it whole again."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from services.api import worker_pb2
from services.common import errors, mux, token_bytes
from services.common.grpc_util import GrpcServer, open_mux_channel
from services.common.prompt_reuse import (
    MIN_REUSE_TOKENS,
    PromptSender,
    PromptStore,
    ReusingStub,
    common_prefix_tokens,
    prompt_key,
)
from services.launcher.supervisor import free_port

pytestmark = pytest.mark.timeout(30)


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(0, 150_000) for _ in range(n)]


def request(ids: list[int]) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(request_id="r", token_ids_u32=token_bytes.pack(ids))


@pytest.mark.parametrize("common", [0, 1, 3, 4, 5, 1000, 16_383, 16_384, 16_385, 40_000])
def test_common_prefix_tokens_is_exact(common: int) -> None:
    a = tokens(40_000, 1)
    b = a[:common] + [x + 1 for x in a[common:common + 7]]
    assert common_prefix_tokens(token_bytes.pack(a), token_bytes.pack(b)) == min(common, len(b))


def test_a_differing_byte_inside_a_token_ends_the_prefix_before_that_token() -> None:
    a = token_bytes.pack([5, 6, 7, 8])
    b = token_bytes.pack([5, 6, 7 + 256, 8])  # differs in the token's second byte
    assert common_prefix_tokens(a, b) == 2


def test_next_turn_travels_as_a_tail_and_is_rebuilt_exactly() -> None:
    sender, store = PromptSender(), PromptStore()
    turn1 = tokens(10_000, 2)
    first = request(turn1)
    assert sender.shorten(first, "s:a") is None and first.prompt_key == "s:a"
    assert token_bytes.unpack(store.resolve(first)) == turn1 and not first.token_ids_u32  # the prompt left it
    turn2 = turn1 + tokens(300, 3)
    second = request(turn2)
    whole = sender.shorten(second, "s:a")
    assert whole == token_bytes.pack(turn2)
    assert second.prompt_base.tokens == len(turn1) and token_bytes.count(second.token_ids_u32) == 300
    assert token_bytes.unpack(store.resolve(second)) == turn2 and not second.HasField("prompt_base")
    assert store.rebuilt == 1
    third = worker_pb2.GenerateRequest(request_id="r")  # the prompt given beside the message
    packed = token_bytes.pack(turn2 + tokens(200, 9))
    assert sender.shorten(third, "s:a", packed) == packed and token_bytes.count(third.token_ids_u32) == 200
    assert store.resolve(third) == packed
    fourth = worker_pb2.GenerateRequest(request_id="r")
    assert sender.shorten(fourth, "", packed) is None and fourth.token_ids_u32 == packed  # no key: whole


def test_a_rewritten_history_sends_what_is_still_in_common() -> None:
    sender, store = PromptSender(), PromptStore()
    turn1 = tokens(12_000, 4)
    first = request(turn1)
    sender.shorten(first, "k")
    store.resolve(first)
    compacted = turn1[:5_000] + tokens(800, 5)  # history rewritten after token 5,000
    second = request(compacted)
    sender.shorten(second, "k")
    assert second.prompt_base.tokens == 5_000
    assert token_bytes.unpack(store.resolve(second)) == compacted
    tiny = request(turn1[:100] + tokens(5_000, 6))  # shares less than MIN_REUSE_TOKENS: goes whole
    assert sender.shorten(tiny, "k") is None and not tiny.HasField("prompt_base")


def test_a_receiver_without_the_prefix_refuses_with_failed_precondition() -> None:
    sender = PromptSender()
    turn1 = tokens(5_000, 7)
    sender.shorten(request(turn1), "k")
    second = request([*turn1, 1, 2, 3])
    sender.shorten(second, "k")
    with pytest.raises(errors.PromptBaseUnknownError) as info:
        PromptStore().resolve(second)  # a restarted receiver
    assert info.value.grpc_status == grpc.StatusCode.FAILED_PRECONDITION
    other = PromptStore()
    other.resolve(_keyed(tokens(5_000, 8), "k"))  # another prompt under k
    with pytest.raises(errors.PromptBaseUnknownError):
        other.resolve(second)


def _keyed(ids: list[int], key: str) -> worker_pb2.GenerateRequest:
    msg = request(ids)
    msg.prompt_key = key
    return msg


def test_stores_are_bounded_in_bytes_least_recently_used_first() -> None:
    store = PromptStore(max_bytes=3 * 4 * 3000)
    for i in range(5):
        store.resolve(_keyed(tokens(3000, i), f"k{i}"))
    assert len(store) == 3
    with pytest.raises(errors.PromptBaseUnknownError):
        sender = PromptSender()
        sender.shorten(_keyed(tokens(3000, 0), ""), "k0")
        msg = request([*tokens(3000, 0), 1])
        sender.shorten(msg, "k0")
        store.resolve(msg)  # k0 was evicted


def test_prompt_key_names_the_session_or_the_opening_tokens() -> None:
    short = token_bytes.pack(tokens(MIN_REUSE_TOKENS - 1, 1))
    long = token_bytes.pack(tokens(MIN_REUSE_TOKENS * 2, 1))
    assert prompt_key("sess-1", short) == ""
    assert prompt_key("sess-1", long) == "s:sess-1"
    same_start = token_bytes.pack([*tokens(MIN_REUSE_TOKENS * 2, 1), 7])
    assert prompt_key("", long) == prompt_key("", same_start) != prompt_key("", token_bytes.pack(tokens(9000, 2)))


# --- over a real mux session -----------------------------------------------------------------------

class Receiver:
    """A Generate handler that resolves prompts as the router and worker do and answers with the digest."""

    def __init__(self) -> None:
        self.store = PromptStore()
        self.seen: list[list[int]] = []

    async def generate(
        self, msg: worker_pb2.GenerateRequest, context: Any
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        try:
            prompt = self.store.resolve(msg)
        except errors.MeshError as err:
            await errors.abort_with(context, err)
        ids = token_bytes.unpack(prompt)
        self.seen.append(ids)
        yield worker_pb2.GenerateResponse(token_ids=[len(ids)])


async def serve(receiver: Receiver, port: int = 0) -> GrpcServer:
    server = GrpcServer(None, "127.0.0.1", port)
    server.add_mux({mux.method_name("Worker", "Generate"):
                    mux.MuxMethod(receiver.generate, worker_pb2.GenerateRequest)})
    await server.start()
    return server


async def send(stub: ReusingStub, ids: list[int], key: str) -> list[int]:
    out: list[int] = []
    async for frame in stub.Generate(request(ids), key=key):
        out.extend(frame.token_ids)
    return out


async def test_a_session_over_a_hop_then_a_receiver_that_lost_the_prefix_gets_the_whole_prompt_again() -> None:
    receiver = Receiver()
    server = await serve(receiver)
    channel = open_mux_channel(server.address)
    stub = ReusingStub(mux.GenerateStub(channel, "Worker"))
    try:
        history = tokens(8_000, 11)
        for turn in range(3):
            history = history + tokens(250, 20 + turn)
            assert await send(stub, history, "s:x") == [len(history)]
            assert receiver.seen[-1] == history
        assert receiver.store.rebuilt == 2
        receiver.store = PromptStore()  # evicted (or a restarted receiver)
        history = history + tokens(250, 30)
        assert await send(stub, history, "s:x") == [len(history)]  # refused, then sent whole
        assert receiver.store.refused == 1 and receiver.seen[-1] == history
        history = history + tokens(250, 31)
        assert await send(stub, history, "s:x") == [len(history)]
        assert receiver.store.rebuilt == 1 and receiver.seen[-1] == history
    finally:
        await channel.close()
        await server.stop(0)


async def test_unavailable_before_the_first_frame_is_retried_whole_until_the_receiver_is_back() -> None:
    receiver = Receiver()
    server = await serve(receiver)
    port = server.port
    channel = open_mux_channel(server.address)
    stub = ReusingStub(mux.GenerateStub(channel, "Worker"), retry_unavailable=5.0)
    try:
        history = tokens(6_000, 40)
        assert await send(stub, history, "s:y") == [len(history)]
        await server.stop(0)
        restarted = Receiver()

        async def restart_later() -> GrpcServer:
            await asyncio.sleep(0.5)  # the stream below fails UNAVAILABLE meanwhile, and is retried
            return await serve(restarted, port)

        restart = asyncio.create_task(restart_later())
        history = history + tokens(300, 41)
        assert await send(stub, history, "s:y") == [len(history)]
        server = await restart
        assert restarted.seen == [history] and stub.retries >= 1
    finally:
        await channel.close()
        await server.stop(0)


async def test_without_a_retry_budget_unavailable_fails_at_once() -> None:
    channel = open_mux_channel(f"127.0.0.1:{free_port()}")
    stub = ReusingStub(mux.GenerateStub(channel, "Worker"))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await send(stub, tokens(10, 1), "")
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE and stub.retries == 0
    finally:
        await channel.close()
