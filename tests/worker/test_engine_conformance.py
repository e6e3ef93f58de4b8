"""The Engine contract, run against every engine: mocker, torch (tiny real model), TensorRT-LLM (fake LLM API).

The tests do not assume what an engine generates: they run a request once, then derive stop strings,
stop tokens and follow-up prompts from what came out (every engine is deterministic for a greedy
request with a given prompt).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from services.common.block_hash import sequence_hashes
from services.common.errors import ContextLengthError, InvalidRequestError
from services.common.model_dir import ModelDir, load_model_dir
from services.worker.engine import EngineOutput, EngineRequest, KvStored, PromptInfo, Usage
from tests.worker.engine_harness import ENGINE_KINDS, HAS_TORCH, Harness, build, collect, eventually, tokens

Make = Callable[..., Awaitable[Harness]]
BS = 16


def prompt(n: int = 40, start: int = 300) -> list[int]:
    return list(range(start, start + n))


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not HAS_TORCH:
        return load_model_dir("").path
    from tests.worker.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def runners() -> dict[str, Any]:
    return {}


@pytest.fixture(params=ENGINE_KINDS)
async def make(request: pytest.FixtureRequest, model_path: Path, runners: dict[str, Any]) -> AsyncIterator[Make]:
    harnesses: list[Harness] = []

    async def factory(**kw: Any) -> Harness:
        harness = await build(request.param, model_path, runners, **kw)
        harnesses.append(harness)
        return harness

    yield factory
    for harness in harnesses:
        await harness.close()


@pytest.fixture(scope="module")
def model(model_path: Path) -> ModelDir:
    return load_model_dir(model_path)


async def test_stream_shape_and_max_tokens(make: Make) -> None:
    h = await make()
    outs = await collect(h.engine, EngineRequest("r1", prompt(40), max_tokens=12, ignore_eos=True))
    assert outs[0].prompt == PromptInfo(40, 0)
    assert all(o.prompt is None for o in outs[1:])
    assert [o.finish_reason for o in outs[:-1]] == [None] * (len(outs) - 1)
    assert outs[-1].finish_reason == "length" and outs[-1].usage == Usage(40, 12, 0)
    assert len(tokens(outs)) == 12
    outs = await collect(h.engine, EngineRequest("r2", prompt(40), max_tokens=1, ignore_eos=True))
    assert len(tokens(outs)) == 1 and outs[-1].finish_reason == "length"
    outs = await collect(h.engine, EngineRequest("r3", prompt(20, 900), ignore_eos=True))  # engine default: 64
    assert len(tokens(outs)) == 64 and outs[-1].usage is not None and outs[-1].usage.completion_tokens == 64


async def test_greedy_is_deterministic(make: Make) -> None:
    h = await make()
    a = await collect(h.engine, EngineRequest("a", prompt(30), max_tokens=16, ignore_eos=True))
    b = await collect(h.engine, EngineRequest("b", prompt(30), max_tokens=16, ignore_eos=True))
    assert tokens(a) == tokens(b)


def stop_string_at(model: ModelDir, ref: list[int]) -> tuple[int, str]:
    """A position k and a stop string that first occurs exactly where token k's text starts."""
    decode = model.tokenizer.decode
    for k in range(2, len(ref)):
        before, upto = decode(ref[:k]), decode(ref[: k + 1])
        stop = upto[len(before) :]
        full = decode(ref)
        if upto.startswith(before) and stop.strip() and full.find(stop) == len(before) and "\ufffd" not in upto:
            return k, stop
    raise AssertionError("no usable stop string in the reference output")


async def test_stop_string_is_not_emitted(make: Make, model: ModelDir) -> None:
    h = await make()
    ref = tokens(await collect(h.engine, EngineRequest("ref", prompt(30), max_tokens=24, ignore_eos=True)))
    k, stop = stop_string_at(model, ref)
    outs = await collect(h.engine, EngineRequest("s", prompt(30), max_tokens=24, ignore_eos=True, stop=[stop]))
    assert tokens(outs) == ref[:k]
    assert outs[-1].finish_reason == "stop" and outs[-1].stop_string == stop
    assert outs[-1].usage is not None and outs[-1].usage.completion_tokens == k + 1


async def test_stop_token_ids_end_without_emitting(make: Make) -> None:
    h = await make()
    ref = tokens(await collect(h.engine, EngineRequest("ref", prompt(30), max_tokens=24, ignore_eos=True)))
    k = next(i for i in range(1, len(ref)) if ref[i] not in ref[:i])
    outs = await collect(h.engine, EngineRequest("s", prompt(30), max_tokens=24, ignore_eos=True,
                                                 stop_token_ids=[ref[k]]))
    assert tokens(outs) == ref[:k] and outs[-1].finish_reason == "stop"
    assert outs[-1].usage is not None and outs[-1].usage.completion_tokens == k


async def test_cancellation_frees_blocks(make: Make) -> None:
    h = await make()
    gen = h.engine.generate(EngineRequest("c1", prompt(100), max_tokens=10_000, ignore_eos=True))
    first = await anext(gen)
    assert first.prompt is not None
    assert await eventually(lambda: h.engine.stats().active_blocks > 0)
    await gen.aclose()
    assert await eventually(lambda: h.engine.stats().active_blocks == 0 and h.engine.stats().active_requests == 0)


async def test_task_cancellation_frees_blocks(make: Make) -> None:
    h = await make()
    started = asyncio.Event()

    async def consume() -> None:
        async for _ in h.engine.generate(EngineRequest("c2", prompt(100), max_tokens=10_000, ignore_eos=True)):
            started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await eventually(lambda: h.engine.stats().active_blocks == 0 and h.engine.stats().active_requests == 0)


async def test_abort_finishes_as_cancelled(make: Make) -> None:
    h = await make()
    outs: list[EngineOutput] = []
    async for out in h.engine.generate(EngineRequest("ab", prompt(40), max_tokens=10_000, ignore_eos=True)):
        outs.append(out)
        if len(outs) == 1:
            await h.engine.abort("ab")
    assert outs[-1].finish_reason == "cancelled"
    assert await eventually(lambda: h.engine.stats().active_requests == 0)


async def test_kv_events_match_the_real_block_set(make: Make) -> None:
    h = await make()
    a = prompt(70)
    outs = await collect(h.engine, EngineRequest("a", a, max_tokens=8, ignore_eos=True))
    b = a + tokens(outs) + prompt(40, 2000)
    await collect(h.engine, EngineRequest("b", b, max_tokens=8, ignore_eos=True))
    assert await eventually(lambda: h.published_blocks() == h.real_blocks()), "published != held"
    assert set(sequence_hashes(b, BS)[: (len(b) - 1) // BS]) <= h.published_blocks()
    assert [e.event_id for e in h.events] == list(range(1, len(h.events) + 1))
    stored = [e for e in h.events if isinstance(e, KvStored)]
    assert stored[0].parent_hash is None and stored[0].blocks[0].block_hash == sequence_hashes(a, BS)[0]
    assert all(blk.token_count == BS for e in stored for blk in e.blocks)


async def test_eviction_is_published(make: Make) -> None:
    h = await make(num_blocks=12)
    for i in range(5):
        await collect(h.engine, EngineRequest(f"e{i}", prompt(64, 1000 + 100 * i), max_tokens=8, ignore_eos=True))
    assert await eventually(lambda: h.published_blocks() == h.real_blocks())
    assert len(h.real_blocks()) <= 12
    assert any(type(e).__name__ == "KvRemoved" for e in h.events)
    assert not set(sequence_hashes(prompt(64, 1000), BS)) & h.published_blocks()  # the oldest went first


async def test_cached_tokens_in_usage(make: Make) -> None:
    h = await make()
    a = prompt(70)
    first = await collect(h.engine, EngineRequest("t1", a, max_tokens=8, ignore_eos=True))
    assert first[-1].usage is not None and first[-1].usage.cached_tokens == 0
    await eventually(lambda: len(h.published_blocks()) >= 4)
    again = await collect(h.engine, EngineRequest("t2", a, max_tokens=4, ignore_eos=True))
    assert again[0].prompt == PromptInfo(70, 64)
    assert again[-1].usage is not None and again[-1].usage.cached_tokens == 64
    turn2 = a + tokens(first) + prompt(30, 3000)
    outs = await collect(h.engine, EngineRequest("t3", turn2, max_tokens=4, ignore_eos=True))
    assert outs[-1].usage is not None and outs[-1].usage.cached_tokens == 64
    exact = prompt(64, 3500)
    await collect(h.engine, EngineRequest("t4", exact, max_tokens=1, ignore_eos=True))
    outs = await collect(h.engine, EngineRequest("t5", exact, max_tokens=1, ignore_eos=True))
    assert outs[-1].usage is not None and outs[-1].usage.cached_tokens == 48  # one token is always computed


async def test_close_is_idempotent_and_ends_every_stream(make: Make) -> None:
    """The ``Engine.close`` docstring's guarantees: streams end cancelled, a second close is a no-op, then
    ``generate`` is refused and the KV event subscription ends."""
    h = await make()
    outs: list[EngineOutput] = []
    stream = h.engine.generate(EngineRequest("cl", prompt(40), max_tokens=10_000, ignore_eos=True))
    outs.append(await anext(stream))
    await h.engine.close()
    await h.engine.close()
    outs.extend([out async for out in stream])
    assert outs[-1].finish_reason == "cancelled"
    with pytest.raises(Exception):  # noqa: B017 (each engine names its refusal; any error refuses)
        await collect(h.engine, EngineRequest("late", prompt(40), max_tokens=4))
    await asyncio.wait_for(h._task, 5)  # the subscription ended: its consumer returned


async def test_close_without_start_is_a_no_op(make: Make) -> None:
    h = await make(start=False)
    await h.engine.close()
    await h.engine.close()


async def test_concurrent_requests_all_complete(make: Make) -> None:
    h = await make()
    reqs = [EngineRequest(f"p{i}", prompt(30, 1000 * (i + 1)), max_tokens=10, ignore_eos=True) for i in range(3)]
    results = await asyncio.gather(*(collect(h.engine, r) for r in reqs))
    assert all(len(tokens(outs)) == 10 for outs in results)
    solo = await collect(h.engine, EngineRequest("solo", prompt(30, 2000), max_tokens=10, ignore_eos=True))
    assert tokens(solo) == tokens(results[1])  # batching does not change what a request generates


async def test_validation_errors_raise_before_output(make: Make) -> None:
    h = await make()
    with pytest.raises(InvalidRequestError):
        await collect(h.engine, EngineRequest("v1", []))
    with pytest.raises(InvalidRequestError):
        await collect(h.engine, EngineRequest("v2", prompt(), max_tokens=-1))
    with pytest.raises(ContextLengthError):
        await collect(h.engine, EngineRequest("v3", prompt(40_000, 0)))
