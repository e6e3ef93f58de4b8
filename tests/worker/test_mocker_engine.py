from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from services.common.errors import ContextLengthError, InvalidRequestError
from services.common.model_dir import ModelDir
from services.worker.engine import Engine, EngineOutput, EngineRequest, KvStored
from services.worker.mocker import MockerEngine
from tests.worker.conftest import TOOL_CALL

Make = Callable[..., Any]


def prompt(n: int = 40, start: int = 300) -> list[int]:
    return list(range(start, start + n))


async def collect(engine: MockerEngine, req: EngineRequest) -> list[EngineOutput]:
    return [out async for out in engine.generate(req)]


def tokens(outs: list[EngineOutput]) -> list[int]:
    return [t for o in outs for t in o.token_ids]


async def test_mocker_satisfies_the_contract(make_engine: Make) -> None:
    engine = await make_engine()
    assert isinstance(engine, Engine)
    info = engine.info()
    assert (info.engine, info.block_size, info.total_blocks) == ("mocker", 16, 16384)


async def test_scripted_completion_decodes_to_script(make_engine: Make, model: ModelDir) -> None:
    engine = await make_engine()
    outs = await collect(engine, EngineRequest("r1", prompt(), match_text="weather in Paris?"))
    assert model.tokenizer.decode(tokens(outs), skip_special_tokens=False) == TOOL_CALL
    assert outs[0].prompt is not None and outs[0].prompt.prompt_tokens == 40
    assert all(o.prompt is None for o in outs[1:])
    last = outs[-1]
    assert last.finish_reason == "stop" and last.usage is not None
    assert last.usage.completion_tokens == len(tokens(outs))
    assert all(t not in model.eos_token_ids for t in tokens(outs))
    assert [o.finish_reason for o in outs[:-1]] == [None] * (len(outs) - 1)


async def test_a_continued_scripted_request_resumes_its_script(make_engine: Make, model: ModelDir) -> None:
    engine = await make_engine()
    whole = tokens(await collect(engine, EngineRequest("w", prompt(), match_text="weather in Paris?")))
    done = 9  # what an earlier worker generated before it died; the router appends it to the prompt
    rest = await collect(engine, EngineRequest("c", prompt() + whole[:done], match_text="weather in Paris?",
                                               continued_tokens=done))
    assert whole[:done] + tokens(rest) == whole  # a clean run's text, not the script from its start
    fresh = await collect(engine, EngineRequest("f", prompt() + whole[:done], match_text="weather in Paris?"))
    assert tokens(fresh) == whole  # not a continuation: the whole script


async def test_a_continuation_after_the_scripts_last_token_stops_at_once(make_engine: Make) -> None:
    """The earlier worker died after the script's last token but before EOS: the continuation ends there (it
    used to go on with filler text, an answer no clean run writes)."""
    engine = await make_engine()
    whole = tokens(await collect(engine, EngineRequest("w", prompt(), match_text="weather in Paris?")))
    rest = await collect(engine, EngineRequest("c", prompt() + whole, match_text="weather in Paris?",
                                               continued_tokens=len(whole)))
    assert tokens(rest) == [] and rest[-1].finish_reason == "stop"


async def test_a_continued_filler_request_goes_on_with_a_clean_runs_text(make_engine: Make) -> None:
    """A migrated request without a script line: the text after the migration is what a clean run writes next
    (the filler is seeded from the original prompt and advanced past the tokens already generated)."""
    engine = await make_engine()
    whole = tokens(await collect(engine, EngineRequest("w", prompt(), max_tokens=40, ignore_eos=True,
                                                       match_text="no script line")))
    done = 13
    rest = await collect(engine, EngineRequest("c", prompt() + whole[:done], max_tokens=40 - done, ignore_eos=True,
                                               match_text="no script line", continued_tokens=done))
    assert whole[:done] + tokens(rest) == whole
    forged = [*whole[:done - 1], whole[done - 1] + 1]  # not what this worker would have written: a fresh seed
    other = await collect(engine, EngineRequest("o", prompt() + forged, max_tokens=5, ignore_eos=True,
                                                match_text="no script line", continued_tokens=done))
    assert len(tokens(other)) == 5


async def test_max_tokens_and_default(make_engine: Make) -> None:
    engine = await make_engine(max_tokens_default=7)
    outs = await collect(engine, EngineRequest("r1", prompt(), max_tokens=5, match_text="weather"))
    assert len(tokens(outs)) == 5 and outs[-1].finish_reason == "length"
    outs = await collect(engine, EngineRequest("r2", prompt(), match_text="no script line"))
    assert len(tokens(outs)) == 7 and outs[-1].finish_reason == "length"
    assert outs[-1].usage is not None and outs[-1].usage.completion_tokens == 7


async def test_stop_string(make_engine: Make, model: ModelDir) -> None:
    engine = await make_engine()
    req = EngineRequest("r1", prompt(), match_text="weather", stop=["<tool_call>"])
    outs = await collect(engine, req)
    text = model.tokenizer.decode(tokens(outs), skip_special_tokens=False)
    assert text == "<think>plan</think>\n\n"
    assert outs[-1].finish_reason == "stop" and outs[-1].stop_string == "<tool_call>"


async def test_stop_token_ids_and_ignore_eos(make_engine: Make, model: ModelDir) -> None:
    engine = await make_engine()
    think_end = model.tokenizer.token_to_id("</think>")
    outs = await collect(engine, EngineRequest("r1", prompt(), match_text="weather", stop_token_ids=[think_end]))
    assert model.tokenizer.decode(tokens(outs), skip_special_tokens=False) == "<think>plan"
    assert outs[-1].finish_reason == "stop"
    outs = await collect(engine, EngineRequest("r2", prompt(), match_text="say hi", ignore_eos=True, max_tokens=10))
    assert len(tokens(outs)) == 10 and outs[-1].finish_reason == "length"
    hi = model.tokenizer.encode("hi there", add_special_tokens=False).ids
    # ignore_eos: EOS is an ordinary token (as in vLLM), filler follows the script
    assert tokens(outs)[: len(hi) + 1] == [*hi, model.eos_token_ids[0]]


async def test_filler_is_deterministic(make_engine: Make) -> None:
    engine = await make_engine()
    a = tokens(await collect(engine, EngineRequest("a", prompt(), max_tokens=20)))
    b = tokens(await collect(engine, EngineRequest("b", prompt(), max_tokens=20)))
    c = tokens(await collect(engine, EngineRequest("c", prompt(start=900), max_tokens=20)))
    assert a == b != c


async def test_shared_prefix_reports_cached_tokens(make_engine: Make) -> None:
    engine = await make_engine()
    first = await collect(engine, EngineRequest("r1", prompt(100), max_tokens=3))
    assert first[0].prompt is not None and first[0].prompt.cached_tokens == 0
    second = await collect(engine, EngineRequest("r2", [*prompt(100), 7, 8, 9], max_tokens=3))
    assert second[0].prompt is not None and second[0].prompt.cached_tokens == 96
    assert second[-1].usage is not None and second[-1].usage.cached_tokens == 96


async def test_concurrent_requests_share_steps(make_engine: Make) -> None:
    engine = await make_engine()
    reqs = [EngineRequest(f"r{i}", prompt(start=1000 * (i + 1)), max_tokens=30) for i in range(4)]
    results = await asyncio.gather(*(collect(engine, r) for r in reqs))
    assert all(len(tokens(outs)) == 30 for outs in results)
    assert engine.stats().steps < 2 * 30  # 4 x 30 tokens sequentially would take 120 steps


async def test_slow_consumer_gets_batched_outputs(make_engine: Make) -> None:
    engine = await make_engine()
    outs: list[EngineOutput] = []
    async for out in engine.generate(EngineRequest("r1", prompt(), max_tokens=50)):
        outs.append(out)
        await asyncio.sleep(0.01)
    assert len(tokens(outs)) == 50
    assert len(outs) < 25


async def test_cancel_frees_blocks(make_engine: Make) -> None:
    engine = await make_engine(speedup=50.0)
    baseline = engine.stats().active_blocks
    got_first = asyncio.Event()

    async def consume() -> None:
        async for _ in engine.generate(EngineRequest("r1", prompt(200), max_tokens=1000)):
            got_first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_first.wait(), 5)
    assert engine.stats().active_blocks > baseline and engine.stats().active_requests == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.stats().active_blocks == baseline
    assert engine.stats().active_requests == 0


async def test_abort_ends_stream_as_cancelled(make_engine: Make) -> None:
    engine = await make_engine(speedup=50.0)
    outs: list[EngineOutput] = []
    async for out in engine.generate(EngineRequest("r1", prompt(), max_tokens=1000)):
        outs.append(out)
        if len(outs) == 1:
            await engine.abort("r1")
    assert outs[-1].finish_reason == "cancelled"
    assert engine.stats().active_blocks == 0


async def test_validation_errors(make_engine: Make) -> None:
    engine = await make_engine(num_blocks=4)
    with pytest.raises(InvalidRequestError):
        await collect(engine, EngineRequest("r1", []))
    with pytest.raises(ContextLengthError):
        await collect(engine, EngineRequest("r2", prompt(64)))
    outs = await collect(engine, EngineRequest("r3", prompt(63), max_tokens=5))
    assert outs[-1].finish_reason == "length"  # fills the whole cache, then runs out of room


async def test_kv_events_streamed(make_engine: Make) -> None:
    from services.common.block_hash import sequence_hashes

    engine = await make_engine()
    sub = engine.kv_events()
    p = prompt(64)
    await collect(engine, EngineRequest("r1", p, max_tokens=1, match_text="say hi"))
    batch = await asyncio.wait_for(sub.__anext__(), 2)
    stored = [b.block_hash for e in batch if isinstance(e, KvStored) for b in e.blocks]
    assert stored[:4] == sequence_hashes(p, 16)


async def test_packed_ids_give_what_the_ids_give(make_engine: Make) -> None:
    """A request that carries its ids packed too (as the worker's gRPC request does) is hashed and seeded from
    those bytes: the same filler and the same stored blocks as the ids alone; other packed ids would differ."""
    from services.common import token_bytes

    results = []
    for packed in (b"", token_bytes.pack(prompt(64)), token_bytes.pack(prompt(64, start=900))):
        engine = await make_engine()  # a fresh cache each: every prompt block is stored again
        sub = engine.kv_events()
        outs = await collect(engine, EngineRequest("r", prompt(64), max_tokens=12, ignore_eos=True,
                                                   match_text="no script line", packed=packed))
        batch = await asyncio.wait_for(sub.__anext__(), 2)
        stored = [b.block_hash for e in batch if isinstance(e, KvStored) for b in e.blocks][:4]
        results.append((tokens(outs), stored))
    assert results[1] == results[0]
    assert results[2][0] != results[0][0] and results[2][1] != results[0][1]  # the bytes are what is read


async def test_preemption_under_kv_pressure(make_engine: Make) -> None:
    # 12 blocks of 16 tokens; three requests that each grow to 4+ blocks cannot all fit.
    engine = await make_engine(num_blocks=12)
    reqs = [EngineRequest(f"r{i}", prompt(40, start=500 * (i + 1)), max_tokens=40) for i in range(3)]
    results = await asyncio.gather(*(collect(engine, r) for r in reqs))
    assert all(len(tokens(outs)) == 40 for outs in results)
    assert all(outs[-1].finish_reason == "length" for outs in results)
    assert engine.stats().preemptions > 0
    assert engine.stats().active_blocks == 0
    # Preemption does not change what a request generates.
    solo = await make_engine()
    expected = tokens(await collect(solo, EngineRequest("x", reqs[2].token_ids, max_tokens=40)))
    assert tokens(results[2]) == expected


async def test_chunked_prefill_of_long_prompt(make_engine: Make) -> None:
    engine = await make_engine(max_num_batched_tokens=64)
    outs = await collect(engine, EngineRequest("r1", prompt(500), max_tokens=2))
    assert len(tokens(outs)) == 2
    assert engine.stats().steps >= 500 // 64


async def test_duplicate_request_id_rejected(make_engine: Make) -> None:
    engine = await make_engine(speedup=10.0)
    gen = engine.generate(EngineRequest("dup", prompt(), max_tokens=100))
    await gen.__anext__()
    with pytest.raises(InvalidRequestError):
        await collect(engine, EngineRequest("dup", prompt()))
    await gen.aclose()
    assert engine.stats().active_requests == 0


async def test_close_finishes_streams(make_engine: Make) -> None:
    engine = await make_engine(speedup=10.0)
    gen = engine.generate(EngineRequest("r1", prompt(), max_tokens=1000))
    await gen.__anext__()
    await engine.close()
    rest = [o async for o in gen]
    assert rest[-1].finish_reason == "cancelled"


async def test_lone_request_out_of_room_does_not_stall_the_queue(make_engine: Make) -> None:
    # Two requests that each need the whole cache: the first finishes with "length" when it runs
    # out of blocks, and the other one (preempted meanwhile) still completes.
    engine = await make_engine(num_blocks=4)
    a = EngineRequest("a", prompt(40, start=100), max_tokens=100)
    b = EngineRequest("b", prompt(40, start=900), max_tokens=100)
    ra, rb = await asyncio.wait_for(asyncio.gather(collect(engine, a), collect(engine, b)), 5)
    assert ra[-1].finish_reason == rb[-1].finish_reason == "length"
    assert len(tokens(ra)) == len(tokens(rb)) == 64 - 40
    assert engine.stats().active_blocks == 0


async def test_a_loop_behind_its_model_advances_quiet_steps_with_the_same_output(
    make_engine: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a speedup whose decode steps are shorter than their CPU work the step loop lags its model and advances
    the quiet steps that fit in the lag together (``StepLoop._catch_up``); tokens, endings and usage are the
    step-by-step loop's: a scripted completion ends at its EOS (a stop id), filler runs to max_tokens."""
    from services.kvcore.core import EngineCore
    from services.kvcore.loop import StepLoop

    advanced: list[int] = []
    real = EngineCore.advance_quiet

    def counting(self: EngineCore, steps: int) -> None:
        advanced.append(steps)
        real(self, steps)

    monkeypatch.setattr(EngineCore, "advance_quiet", counting)

    requests = [EngineRequest("s", prompt(), match_text="weather in Paris?"),
                EngineRequest("f", prompt(start=700), max_tokens=200),
                EngineRequest("i", prompt(start=900), max_tokens=100, ignore_eos=True)]

    async def run() -> tuple[list[tuple[list[int], str | None, object]], list[int]]:
        engine = await make_engine(speedup=1e6)
        outputs, quiet = [], []
        for req in requests:
            advanced.clear()
            outs = await collect(engine, req)
            outputs.append((tokens(outs), outs[-1].finish_reason, outs[-1].usage))
            quiet.append(sum(advanced))
        return outputs, quiet

    caught_up, quiet = await run()
    assert all(n > len(out) // 2 for n, (out, _, _) in zip(quiet, caught_up, strict=True))  # most decode steps
    monkeypatch.setattr(StepLoop, "_catch_up", lambda self, clock, now: clock)
    assert await run() == (caught_up, [0, 0, 0])
    assert [reason for _, reason, _ in caught_up] == ["stop", "length", "length"]


def test_the_grpc_request_hands_its_packed_ids_on() -> None:
    from services.api import worker_pb2
    from services.common import token_bytes
    from services.worker.convert import request_from_proto

    packed = token_bytes.pack(prompt(40))
    request = request_from_proto(worker_pb2.GenerateRequest(request_id="r", token_ids_u32=packed))
    assert request.packed == packed and list(request.token_ids) == prompt(40)
