"""The TensorRT-LLM adapter: event normalisation, sampling-parameter mapping, the lazy import's error."""

from __future__ import annotations

import datetime
import importlib.util
from typing import Any

import pytest

from services.common.block_hash import sequence_hashes
from services.common.errors import UnavailableError
from services.common.model_dir import load_model_dir
from services.kvcore.tokens import FillerVocabulary
from services.worker.engine import EngineRequest, KvCleared, KvRemoved, KvStored, StoredBlock
from services.worker.registry import build_engine
from services.worker.settings import WorkerSettings
from services.worker.trtllm import INSTALL_HINT, KvEventNormaliser, TrtllmApi, TrtllmEngine
from services.worker.trtllm.api import special_ids
from services.worker.trtllm.events import to_signed_i64
from services.worker.trtllm.retention import retention_config
from tests.worker.engine_harness import collect
from tests.worker.fake_trtllm import FakeLLM, KvCacheConfig, KvCacheRetentionConfig, SamplingParams

BS = 4


def block(engine_hash: int, tokens: list[int]) -> dict[str, Any]:
    return {"type": "stored_block", "block_hash": engine_hash, "cache_level": 0, "priority": 35,
            "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in tokens]}


def ev(event_id: int, data: dict[str, Any], window: int | None = 4096) -> dict[str, Any]:
    out: dict[str, Any] = {"event_id": event_id, "data": data}
    if window is not None:
        out["window_size"] = window
    return out


def created(event_id: int, window: int | None, blocks: int = 100) -> dict[str, Any]:
    return ev(event_id, {"type": "created", "num_blocks_per_cache_level": [blocks, 0]}, window)


def test_stored_blocks_get_our_hashes_and_engine_ids_stay_opaque() -> None:
    n = KvEventNormaliser(BS)
    big = (1 << 64) - 5
    out = n.feed(ev(0, {"type": "stored", "parent_hash": None,
                        "blocks": [block(big, [1, 2, 3, 4]), block(77, [5, 6, 7, 8])]}))
    ours = sequence_hashes([1, 2, 3, 4, 5, 6, 7, 8], BS)
    assert out == [KvStored(1, None, (StoredBlock(ours[0], to_signed_i64(big), BS), StoredBlock(ours[1], 77, BS)))]
    assert to_signed_i64(big) == -5
    child = n.feed(ev(1, {"type": "stored", "parent_hash": 77, "blocks": [block(9, [9, 10, 11, 12])]}))
    assert isinstance(child[0], KvStored) and child[0].parent_hash == ours[1]
    assert child[0].blocks[0].block_hash == sequence_hashes(list(range(1, 13)), BS)[2]
    assert n.feed(ev(2, {"type": "removed", "block_hashes": [big, 77]})) == [KvRemoved(3, (ours[0], ours[1]))]


def test_partial_blocks_are_dropped_with_their_removal() -> None:
    n = KvEventNormaliser(BS)
    out = n.feed(ev(0, {"type": "stored", "parent_hash": None,
                        "blocks": [block(1, [1, 2, 3, 4]), block(2, [5, 6]), block(3, [7, 8, 9, 10])]}))
    assert len(out) == 1 and isinstance(out[0], KvStored) and len(out[0].blocks) == 1
    assert n.feed(ev(1, {"type": "removed", "block_hashes": [2]})) == []
    assert n.feed(ev(2, {"type": "stored", "parent_hash": 2, "blocks": [block(4, [1, 1, 1, 1])]})) == []  # orphan


def test_events_below_the_largest_window_are_dropped() -> None:
    n = KvEventNormaliser(BS)
    assert n.feed(created(0, 128, 50)) == [] and n.feed(created(1, 4096, 100)) == []
    assert n.max_window == 4096 and n.num_blocks == 100
    assert n.feed(ev(2, {"type": "stored", "parent_hash": None, "blocks": [block(1, [1, 2, 3, 4])]}, 128)) == []
    kept = n.feed(ev(3, {"type": "stored", "parent_hash": None, "blocks": [block(1, [1, 2, 3, 4])]}, 4096))
    assert len(kept) == 1 and kept[0].event_id == 1
    updated = {"type": "updated", "block_hash": 1, "cache_level": {"type": "event_diff", "old_value": 0,
                                                                   "new_value": 1}, "priority": None}
    assert n.feed(ev(4, updated)) == []
    assert n.feed(created(5, 4096)) == [KvCleared(2)]  # the cache was rebuilt


def test_events_without_window_size_all_pass() -> None:
    n = KvEventNormaliser(BS)
    n.feed(created(0, None))
    assert len(n.feed(ev(1, {"type": "stored", "parent_hash": None, "blocks": [block(1, [1, 2, 3, 4])]}, None))) == 1


async def test_sampling_params_are_mapped() -> None:
    model = load_model_dir("")
    seen: list[Any] = []

    def params(**kw: Any) -> SamplingParams:
        seen.append(kw)
        return SamplingParams(**kw)

    llm = FakeLLM(FillerVocabulary(model.tokenizer).words, kv_cache_config=KvCacheConfig(tokens_per_block=16))
    end_id, pad_id = special_ids(model)
    assert end_id is not None and pad_id is not None
    engine = TrtllmEngine(TrtllmApi(llm, params, 16, end_id, pad_id), model, num_blocks=64)
    await engine.start()
    try:
        await collect(engine, EngineRequest("m", list(range(300, 340)), max_tokens=3, temperature=0.7, top_p=0.9,
                                            top_k=20, seed=5, stop_token_ids=[11]))
    finally:
        await engine.close()
    assert seen == [{"max_tokens": 3, "end_id": end_id, "pad_id": pad_id,
                     "stop_token_ids": sorted({11, *model.eos_token_ids} - {end_id}), "ignore_eos": False,
                     "detokenize": False, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "seed": 5}]
    assert engine.info().total_blocks == 512  # from the engine's "created" event, not the setting


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is not None, reason="tensorrt_llm is installed")
def test_missing_tensorrt_llm_says_how_to_get_it() -> None:
    settings = WorkerSettings(engine="trtllm", model=str(load_model_dir("").path))
    with pytest.raises(UnavailableError, match="TensorRT-LLM image") as info:
        build_engine(settings, load_model_dir(""))
    assert INSTALL_HINT in str(info.value)


async def test_retention_hints_map_onto_kv_cache_retention_priorities() -> None:
    model = load_model_dir("")
    llm = FakeLLM(FillerVocabulary(model.tokenizer).words, kv_cache_config=KvCacheConfig(tokens_per_block=16))
    end_id, pad_id = special_ids(model)
    assert end_id is not None and pad_id is not None
    engine = TrtllmEngine(TrtllmApi(llm, SamplingParams, 16, end_id, pad_id, KvCacheRetentionConfig), model,
                          num_blocks=64)
    await engine.start()
    try:
        for rid, hint in (("plain", {}), ("cached", {"retention_hold_s": 300.0}),
                          ("tool", {"retention_tool_call_hold_s": 60.0}), ("done", {"retention_first": True})):
            await collect(engine, EngineRequest(rid, list(range(300, 340)), max_tokens=2, **hint))
    finally:
        await engine.close()
    plain, cached, tool, done = llm.retention_configs
    assert plain is None  # no hint: the call is what it always was
    assert cached is not None and tool is not None and done is not None
    (held,) = cached.token_range_retention_configs
    assert (held.token_start, held.token_end, held.priority) == (0, None, 70)
    assert held.duration_ms == datetime.timedelta(seconds=300) and cached.decode_retention_priority == 70
    assert tool.token_range_retention_configs[0].priority == 55 < 70
    assert tool.decode_duration_ms == datetime.timedelta(seconds=60)
    assert done.token_range_retention_configs[0].priority == 1 and done.decode_duration_ms is None


def test_the_worker_switch_keeps_hints_from_tensorrt_llm() -> None:
    hinted = EngineRequest("r", [1, 2, 3], retention_hold_s=10.0)
    assert retention_config(KvCacheRetentionConfig, hinted) is not None
    assert retention_config(KvCacheRetentionConfig, hinted, enabled=False) is None
    assert retention_config(None, hinted) is None  # an install without the class
