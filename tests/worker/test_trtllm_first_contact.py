"""Issue 17: what the trtllm adapter must do so that it survives first contact with a real TensorRT-LLM.

Each test runs against the fake (``tests/worker/fake_trtllm.py``), which now refuses and misbehaves where
TensorRT-LLM does; each would fail with the adapter as it was before the issue.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from services.common.block_hash import sequence_hashes
from services.common.errors import InvalidRequestError, UnavailableError
from services.common.model_dir import ModelDir, load_model_dir
from services.kvcore.config import BatchingConfig
from services.kvcore.tokens import FillerVocabulary
from services.worker.engine import EngineRequest, PromptInfo
from services.worker.metrics import WorkerMetrics
from services.worker.settings import TrtllmSettings, WorkerSettings
from services.worker.trtllm import KvEventNormaliser, TrtllmApi, TrtllmEngine, load_llm
from services.worker.trtllm.api import special_ids
from tests.worker.engine_harness import collect, eventually, tokens
from tests.worker.fake_trtllm import FakeLLM, SamplingParams, fake_module

REPO = Path(__file__).resolve().parents[2]
OPTIONS = TrtllmSettings(tensor_parallel_size=1, free_gpu_memory_fraction=0.9, event_buffer_max_size=1024, dtype="auto")
BS = 16

Build = Callable[..., Awaitable[tuple[TrtllmEngine, FakeLLM]]]


@pytest.fixture(scope="module")
def model() -> ModelDir:
    return load_model_dir("")


@pytest.fixture
async def build(model: ModelDir) -> AsyncIterator[Build]:
    engines: list[TrtllmEngine] = []

    async def make(
        *, block_size: int = BS, max_num_batched_tokens: int = 8192, **knobs: Any
    ) -> tuple[TrtllmEngine, FakeLLM]:
        batching = BatchingConfig(block_size=block_size, num_blocks=256, max_num_batched_tokens=max_num_batched_tokens)
        api = load_llm(model, OPTIONS, batching, fake_module(FillerVocabulary(model.tokenizer).words, **knobs))
        engine = TrtllmEngine(api, model, num_blocks=256, poll_interval=0.001, max_poll_interval=0.005)
        await engine.start()
        engines.append(engine)
        assert isinstance(api.llm, FakeLLM)
        return engine, api.llm

    yield make
    for engine in engines:
        await engine.close()


def prompt(n: int, start: int = 300) -> list[int]:
    return list(range(start, start + n))


# -- 1. chunked prefill --------------------------------------------------------------------------------


async def test_prompts_over_the_token_budget_are_prefilled_in_chunks(build: Build) -> None:
    engine, llm = await build(max_num_batched_tokens=64)
    assert llm.args.enable_chunked_prefill and llm.args.max_num_tokens == 64
    outs = await collect(engine, EngineRequest("long", prompt(200), max_tokens=4, ignore_eos=True))
    assert len(tokens(outs)) == 4 and outs[-1].finish_reason == "length"


def test_the_fake_refuses_long_prompts_without_chunked_prefill(model: ModelDir) -> None:
    llm = FakeLLM(FillerVocabulary(model.tokenizer).words, max_num_tokens=64)  # llm.py _check_arguments
    with pytest.raises(ValueError, match="max_num_tokens"):
        llm.generate_async(prompt(65), SamplingParams(end_id=2), streaming=True)


# -- 2. KV-event polling after the first output ---------------------------------------------------------


async def test_polling_starts_after_the_first_output(build: Build, capfd: pytest.CaptureFixture[str]) -> None:
    engine, llm = await build()
    await asyncio.sleep(0.05)
    assert not engine.polling and llm.early_polls == 0
    assert capfd.readouterr().err == ""  # no raw text from TensorRT-LLM breaking the JSON logs
    a = prompt(70)
    await collect(engine, EngineRequest("a", a, max_tokens=4, ignore_eos=True))
    assert engine.polling
    assert await eventually(lambda: set(sequence_hashes(a, BS)) <= engine.normaliser.published())
    assert llm.early_polls == 0 and "Iteration statistics" not in capfd.readouterr().err


async def test_the_fake_queues_exist_from_the_first_request(model: ModelDir) -> None:
    llm = FakeLLM(FillerVocabulary(model.tokenizer).words, enable_iter_perf_stats=True)
    with pytest.raises(AssertionError, match="not properly instantiated"):  # executor.py aget_kv_events
        llm.get_kv_cache_events_async(timeout=0)
    result = llm.generate_async(prompt(20), SamplingParams(end_id=2, max_tokens=1), streaming=True)
    async for _ in result:
        pass
    events = llm.get_kv_cache_events_async(timeout=0)
    drained = []
    with pytest.raises(asyncio.QueueEmpty):  # llmapi/utils.py AsyncQueue.get, timeout 0
        async for event in events:
            drained.append(event)
    assert drained and drained[0]["data"]["type"] == "created"
    llm.shutdown()


# -- 3. iteration stats ----------------------------------------------------------------------------------


async def test_active_blocks_come_from_iteration_stats(build: Build) -> None:
    engine, llm = await build()
    assert llm.args.enable_iter_perf_stats
    gen = engine.generate(EngineRequest("s", prompt(100), max_tokens=10_000, ignore_eos=True))
    await anext(gen)
    assert await eventually(lambda: engine.stats().active_blocks >= 100 // BS)
    await gen.aclose()


async def test_the_fake_has_no_stats_without_the_flag(model: ModelDir) -> None:
    llm = FakeLLM(FillerVocabulary(model.tokenizer).words)
    result = llm.generate_async(prompt(40), SamplingParams(end_id=2, max_tokens=3), streaming=True)
    async for _ in result:
        pass
    with pytest.raises(asyncio.QueueEmpty):
        async for _ in llm.get_stats_async(timeout=0):
            pytest.fail("iteration stats without enable_iter_perf_stats")
    llm.shutdown()


# -- 4. block size ----------------------------------------------------------------------------------------


def test_trtllm_block_size_defaults_to_tensorrt_llms() -> None:
    assert WorkerSettings(engine="trtllm").batching().block_size == 32
    assert WorkerSettings(engine="mocker").batching().block_size == 16
    assert WorkerSettings(engine="trtllm", block_size=64).batching().block_size == 64


async def test_the_engine_publishes_its_real_block_size(build: Build) -> None:
    engine, llm = await build(block_size=32)
    assert engine.info().block_size == llm.args.kv_cache_config.tokens_per_block == 32
    a = prompt(70)
    await collect(engine, EngineRequest("a", a, max_tokens=2, ignore_eos=True))
    assert await eventually(lambda: set(sequence_hashes(a, 32)) <= engine.normaliser.published())


async def test_a_block_size_the_engine_does_not_run_is_refused(build: Build) -> None:
    with pytest.raises(UnavailableError, match="--block-size 64"):
        await build(block_size=16, forced_tokens_per_block=64)


async def test_stats_showing_another_block_size_stop_new_requests(model: ModelDir) -> None:
    llm = FakeLLM(FillerVocabulary(model.tokenizer).words, enable_iter_perf_stats=True)  # runs 32
    end_id, pad_id = special_ids(model)
    assert end_id is not None and pad_id is not None
    engine = TrtllmEngine(
        TrtllmApi(llm, SamplingParams, 16, end_id, pad_id),
        model,
        num_blocks=64,
        poll_interval=0.001,
        max_poll_interval=0.005,
    )
    await engine.start()
    try:
        await collect(engine, EngineRequest("a", prompt(40), max_tokens=3, ignore_eos=True))
        with pytest.raises(UnavailableError, match="32 tokens per block"):
            for _ in range(500):
                await collect(engine, EngineRequest("b", prompt(40), max_tokens=1, ignore_eos=True))
                await asyncio.sleep(0.01)
    finally:
        await engine.close()


def test_docs_name_the_engine_block_size() -> None:
    gpu = (REPO / "docs" / "gpu.md").read_text()
    assert "default 16" not in gpu and "32" in gpu


# -- 5. no tokenizer inside TensorRT-LLM -------------------------------------------------------------------


async def test_ids_come_from_our_model_directory(build: Build, model: ModelDir) -> None:
    engine, llm = await build(tokenizer_loads=False)
    assert llm.args.skip_tokenizer_init and llm.tokenizer is None
    outs = await collect(engine, EngineRequest("t", prompt(30), max_tokens=3, ignore_eos=True))
    assert len(tokens(outs)) == 3
    assert engine.api.end_id == model.eos_token_ids[0]


def test_the_fake_fails_requests_without_end_id_or_tokenizer(model: ModelDir) -> None:
    llm = FakeLLM(FillerVocabulary(model.tokenizer).words, tokenizer_loads=False)  # llm.py _prepare_sampling_params
    with pytest.raises(ValueError, match="tokenizer is required"):
        llm.generate_async(prompt(10), SamplingParams(max_tokens=2), streaming=True)


# -- 6. sampling values TensorRT-LLM rejects -------------------------------------------------------------


@pytest.mark.parametrize(("field", "value"), [("temperature", -0.5), ("top_p", 1.5), ("top_p", -0.1), ("top_k", -2)])
async def test_values_tensorrt_llm_rejects_are_invalid_requests(build: Build, field: str, value: float) -> None:
    engine, _ = await build()
    with pytest.raises(InvalidRequestError) as info:
        await collect(engine, EngineRequest("v", prompt(20), max_tokens=2, **{field: value}))
    assert info.value.param == field and info.value.http_status == 400


@pytest.mark.parametrize(
    "kw",
    [
        {"top_k": -1, "temperature": 0.7},
        {"top_k": 0, "temperature": 0.7},
        {"seed": -1, "temperature": 0.7},
        {"top_p": 1.0, "top_k": 5},
    ],
)
async def test_openai_conventions_are_mapped_to_tensorrt_llms(build: Build, kw: dict[str, Any]) -> None:
    engine, _ = await build()
    outs = await collect(engine, EngineRequest("m", prompt(20), max_tokens=2, ignore_eos=True, **kw))
    assert len(tokens(outs)) == 2


@pytest.mark.parametrize("kw", [{"top_k": -1}, {"top_p": 1.5}, {"temperature": -1.0}])
def test_the_fake_validates_sampling_like_tensorrt_llm(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="require"):  # sampling_params.py _validate
        SamplingParams(**kw)


# -- 7. cached tokens from our own KV accounting ----------------------------------------------------------


@pytest.mark.parametrize("mode", ["absent", "whole"])
async def test_cached_tokens_fall_back_to_our_kv_accounting(build: Build, mode: str) -> None:
    engine, _ = await build(cached_tokens=mode)
    a = prompt(70)
    first = await collect(engine, EngineRequest("t1", a, max_tokens=4, ignore_eos=True))
    assert first[0].prompt == PromptInfo(70, 0)
    assert await eventually(lambda: set(sequence_hashes(a, BS)) <= engine.normaliser.published())
    again = await collect(engine, EngineRequest("t2", a, max_tokens=2, ignore_eos=True))
    assert again[0].prompt == PromptInfo(70, 64)
    assert again[-1].usage is not None and again[-1].usage.cached_tokens == 64


# -- 8. multimodal KV events ---------------------------------------------------------------------------------


def _mm_event(event_id: int, parent: int | None, block_hash: int, token_ids: list[Any], **extra: Any) -> dict[str, Any]:
    block = {
        "type": "stored_block",
        "block_hash": block_hash,
        "cache_level": 0,
        "priority": 0,
        "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in token_ids],
        **extra,
    }
    return {"event_id": event_id, "data": {"type": "stored", "parent_hash": parent, "blocks": [block]}}


def test_multimodal_events_are_skipped_and_counted() -> None:
    n = KvEventNormaliser(4)
    digest = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
    assert n.feed(_mm_event(0, None, 101, [1, digest, 1001, 1002])) == []
    assert n.feed(_mm_event(1, 101, 102, [5, 6, 7, 8])) == []  # chained on an image block
    keyed = [{"type": "mm_key", "hash": digest, "uuid": "9dc26f865941d289", "start_offset": 0}]
    assert n.feed(_mm_event(2, None, 103, [1, 2, 3, 4], mm_keys=keyed)) == []
    assert n.skipped == {"multimodal": 3}
    assert n.feed({"event_id": 3, "data": {"type": "removed", "block_hashes": [101, 102, 103]}}) == []
    assert len(n.feed(_mm_event(4, None, 104, [1, 2, 3, 4], mm_keys=[]))) == 1  # text still flows


async def test_skipped_events_are_a_worker_metric(build: Build) -> None:
    engine, _ = await build()
    engine.normaliser.feed(_mm_event(0, None, 7, ["ab" * 32] * BS))
    metrics = WorkerMetrics()
    metrics.watch(engine, "w1")
    text = generate_latest(metrics.registry).decode()
    assert re.search(r'harnessmesh_worker_kv_events_skipped_total\{reason="multimodal",worker="w1"\} 1\.0', text)


# -- 9. the image -------------------------------------------------------------------------------------------


def test_the_image_is_pinned_and_checks_tensorrt_llm_still_imports() -> None:
    dockerfile = (REPO / "Dockerfile.trtllm").read_text()
    tag = re.search(r"ARG TRTLLM_IMAGE=nvcr\.io/nvidia/tensorrt-llm/release:(\S+)", dockerfile)
    assert tag is not None and tag.group(1) in (REPO / "docs" / "gpu.md").read_text()
    steps = "\n".join(line for line in dockerfile.splitlines() if not line.lstrip().startswith("#"))
    install = steps.index("pip install")
    assert steps.index("pip check") > install
    assert steps.index("import tensorrt_llm") > install


def test_a_removed_multimodal_block_no_longer_shadows_its_hash() -> None:
    """Item 8: a removed multimodal block is forgotten: a later text block under the same engine hash (and its
    child) is published, and the skipped set does not grow without bound."""
    n = KvEventNormaliser(4)
    assert n.feed(_mm_event(0, None, 101, [1, "ab" * 32, 3, 4])) == []
    assert n.feed({"event_id": 1, "data": {"type": "removed", "block_hashes": [101]}}) == []
    assert len(n.feed(_mm_event(2, None, 101, [1, 2, 3, 4]))) == 1  # the engine reuses the id for a text block
    assert len(n.feed(_mm_event(3, 101, 102, [5, 6, 7, 8]))) == 1  # and its child is published
    assert n.skipped == {"multimodal": 1}


def test_a_model_without_an_eos_id_refuses_to_start(model: ModelDir) -> None:
    """Item 5: TensorRT-LLM has no tokenizer to find ``end_id`` in, so a model directory naming no EOS id is
    refused at start, not by every request."""
    no_eos = dataclasses.replace(model, eos_token_ids=())
    with pytest.raises(UnavailableError, match="names no EOS token id"):
        load_llm(no_eos, OPTIONS, BatchingConfig(block_size=BS, num_blocks=64),
                 fake_module(FillerVocabulary(model.tokenizer).words))
