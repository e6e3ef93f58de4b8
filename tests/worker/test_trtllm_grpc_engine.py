"""The trtllm-grpc engine against the fake ``trtllm-serve --grpc`` (tests/worker/fake_trtllm_grpc.py): what the
conformance suite does not cover -- the fallbacks when KV events are missing or ambiguous, the sampling
conventions on the wire, block-size and connection failures."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from services.common.errors import InvalidRequestError, UnavailableError
from services.common.model_dir import ModelDir, load_model_dir
from services.worker.engine import EngineRequest, KvCleared, KvEvent, PromptInfo
from services.worker.trtllm_grpc import TrtllmGrpcClient, TrtllmGrpcEngine
from services.worker.trtllm_grpc.client import GenerateParams
from tests.worker.engine_harness import collect, eventually, fold, tokens
from tests.worker.fake_trtllm_grpc import FakeTrtllmServer, start_fake_server

BS = 32
Make = Callable[..., Awaitable[tuple[TrtllmGrpcEngine, FakeTrtllmServer, list[KvEvent]]]]


def prompt(n: int, start: int = 300) -> list[int]:
    return list(range(start, start + n))


@pytest.fixture
async def make() -> AsyncIterator[Make]:
    started: list[tuple[TrtllmGrpcEngine, FakeTrtllmServer]] = []

    async def factory(model: ModelDir | None = None, engine_block_size: int = BS,
                      **server_knobs: Any) -> tuple[TrtllmGrpcEngine, FakeTrtllmServer, list[KvEvent]]:
        model = model or load_model_dir("")
        server = await start_fake_server(model, **{"block_size": BS, **server_knobs})
        engine = TrtllmGrpcEngine(TrtllmGrpcClient(server.target), model, block_size=engine_block_size,
                                  num_blocks=512, max_tokens_default=16, resubscribe=(0.01, 0.05))
        events: list[KvEvent] = []
        feed = engine.kv_events()

        async def drain() -> None:
            async for batch in feed:
                events.extend(batch)

        asyncio.get_running_loop().create_task(drain())
        await engine.start()
        started.append((engine, server))
        return engine, server, events

    yield factory
    for engine, server in started:
        await engine.close()
        await server.stop()


async def test_a_server_without_the_subscription_falls_back_to_no_events(make: Make) -> None:
    engine, server, events = await make(with_subscription=False)
    first = await collect(engine, EngineRequest("a", prompt(100), max_tokens=4, ignore_eos=True))
    assert first[-1].finish_reason == "length"
    assert await eventually(lambda: engine.kv_events_mode == "unavailable")
    again = await collect(engine, EngineRequest("b", prompt(100), max_tokens=4, ignore_eos=True))
    assert again[0].prompt == PromptInfo(100, 96)  # the server's own figure, as no events say what it holds
    assert events == [] and server.subscriptions == 0


async def test_a_dropped_subscription_is_resumed_and_the_block_set_stays_exact(make: Make) -> None:
    engine, server, events = await make(fail_subscriptions=2)
    a = prompt(100)
    await collect(engine, EngineRequest("a", a, max_tokens=8, ignore_eos=True))
    await collect(engine, EngineRequest("b", a + prompt(70, 5000), max_tokens=8, ignore_eos=True))
    assert await eventually(lambda: engine.kv_events_mode == "subscribed" and bool(events))
    assert await eventually(lambda: fold(events) == server.llm.cached_sequence_hashes())
    assert engine.subscriptions >= 3
    assert [e.event_id for e in events] == list(range(1, len(events) + 1))


async def test_events_resubscribed_after_publishing_start_with_a_clear(make: Make) -> None:
    engine, server, events = await make()
    await collect(engine, EngineRequest("a", prompt(100), max_tokens=8, ignore_eos=True))
    assert await eventually(lambda: fold(events) == server.llm.cached_sequence_hashes() != set())
    await server.server.stop(None)  # the stream breaks; what happens until it is back is unknown
    assert await eventually(lambda: any(isinstance(e, KvCleared) for e in events))
    assert fold(events) == set()


async def test_a_variable_sliding_window_model_publishes_no_events(make: Make, tmp_path: Path) -> None:
    root = tmp_path / "gemma-like"
    shutil.copytree(load_model_dir("").path, root)
    config = json.loads((root / "config.json").read_text())
    config["layer_types"] = ["sliding_attention", "full_attention"] * 2
    (root / "config.json").write_text(json.dumps(config))
    engine, server, events = await make(model=load_model_dir(root), single_window=False)
    await collect(engine, EngineRequest("a", prompt(100), max_tokens=8, ignore_eos=True))
    await collect(engine, EngineRequest("b", prompt(100), max_tokens=8, ignore_eos=True))
    assert engine.kv_events_mode == "off" and server.subscriptions == 0 and events == []


async def test_sampling_goes_out_in_trtllm_conventions(make: Make) -> None:
    engine, server, _ = await make()
    await collect(engine, EngineRequest("g", prompt(40), max_tokens=2, ignore_eos=True))
    assert server.params[-1].temperature == 0.0  # greedy, not the server's default of 1.0
    await collect(engine, EngineRequest("s", prompt(40), max_tokens=2, ignore_eos=True, top_k=-1, seed=-1,
                                        temperature=0.7, top_p=0.9))
    sent = server.params[-1]
    assert sent.top_k is None and sent.seed == (1 << 64) - 1 and sent.top_p == pytest.approx(0.9)
    demo = load_model_dir("")
    await collect(engine, EngineRequest("e", prompt(40), max_tokens=2))
    assert set(demo.eos_token_ids) <= set(server.params[-1].stop_token_ids or [])
    seen = len(server.params)
    with pytest.raises(InvalidRequestError):
        await collect(engine, EngineRequest("bad", prompt(40), top_p=1.5))
    assert len(server.params) == seen  # refused before the server saw it


async def test_a_retention_hint_is_served_and_not_put_on_the_wire(make: Make) -> None:
    """The schema's ``kv_cache_retention`` (policy + config_json) is read by no TensorRT-LLM servicer
    (docs/agent-kv.md): a hinted request goes out as an unhinted one."""
    engine, server, _ = await make()
    for rid, hint in (("cached", {"retention_hold_s": 300.0}), ("tool", {"retention_tool_call_hold_s": 60.0}),
                      ("done", {"retention_first": True}), ("sub", {"retention_answer_first": True})):
        outputs = await collect(engine, EngineRequest(rid, prompt(40), max_tokens=2, ignore_eos=True, **hint))
        assert tokens(outputs) and outputs[-1].finish_reason == "length"
        assert not server.requests[-1].HasField("kv_cache_retention")


async def test_what_the_server_refuses_is_invalid_request(make: Make) -> None:
    _, server, _ = await make()
    client = TrtllmGrpcClient(server.target)
    params = GenerateParams("x", prompt(10), max_tokens=2, stop_token_ids=[], ignore_eos=True, temperature=-1.0)
    with pytest.raises(InvalidRequestError, match="temperature"):
        async for _ in client.generate(params):
            pass
    await client.close()


async def test_a_stop_we_enforce_aborts_the_request_on_the_server(make: Make) -> None:
    engine, server, _ = await make()
    ref = tokens(await collect(engine, EngineRequest("ref", prompt(40), max_tokens=12, ignore_eos=True)))
    k = next(i for i in range(1, len(ref)) if ref[i] not in ref[:i])
    outs = await collect(engine, EngineRequest("st", prompt(40), max_tokens=12, ignore_eos=True,
                                               stop=[load_model_dir("").tokenizer.decode([ref[k]])]))
    assert outs[-1].finish_reason == "stop"
    assert await eventually(lambda: "st" in server.aborts)


async def test_another_block_size_on_the_server_stops_new_requests(make: Make) -> None:
    engine, _, _ = await make(block_size=16, engine_block_size=BS)
    await collect(engine, EngineRequest("a", prompt(100), max_tokens=4, ignore_eos=True))
    assert await eventually(lambda: engine._refusal is not None)
    with pytest.raises(UnavailableError, match="--block-size 16"):
        await collect(engine, EngineRequest("b", prompt(40)))


async def test_subscribing_before_the_first_request_fails_on_the_server(make: Make) -> None:
    _, server, _ = await make()
    client = TrtllmGrpcClient(server.target)
    with pytest.raises(Exception) as raised:
        async for _ in client.subscribe_kv_events():
            pass
    assert not isinstance(raised.value, grpc.aio.AioRpcError)  # mapped to our errors
    await client.close()


async def test_start_gives_up_when_no_server_answers() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    engine = TrtllmGrpcEngine(TrtllmGrpcClient(f"127.0.0.1:{port}"), load_model_dir(""), block_size=BS,
                              num_blocks=64, max_tokens_default=8, connect_timeout=0.5)
    with pytest.raises(UnavailableError, match="did not become healthy"):
        await engine.start()
    await engine.close()
