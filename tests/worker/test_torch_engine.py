"""The torch engine on a tiny random-weight model: loading, determinism, cache correctness, batching, pressure."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.worker.engine_harness import TORCH_MISSING

pytest.importorskip("torch", reason=TORCH_MISSING)

import torch

from services.common.block_hash import sequence_hashes
from services.common.model_dir import load_model_dir
from services.worker.engine import EngineRequest
from services.worker.registry import build_engine
from services.worker.settings import WorkerSettings
from services.worker.torch_engine import ModelRunner, Sampler, TorchConfig, TorchEngine
from tests.worker.engine_harness import collect, tokens
from tests.worker.tiny_model import build_tiny_model


class RecordingSampler(Sampler):
    """Keeps the logits behind every sampled token, per request."""

    def __init__(self) -> None:
        super().__init__()
        self.logits: dict[str, list[torch.Tensor]] = {}

    def observe(self, request_id: str, logits: torch.Tensor) -> None:
        self.logits.setdefault(request_id, []).append(logits.clone())


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def runner(model_path: Path) -> ModelRunner:
    return ModelRunner(model_path)


Make = Callable[..., Any]


@pytest.fixture
async def make(model_path: Path, runner: ModelRunner) -> AsyncIterator[Make]:
    engines: list[TorchEngine] = []

    async def factory(sampler: Sampler | None = None, **kw: Any) -> TorchEngine:
        engine = TorchEngine(TorchConfig(**kw), load_model_dir(model_path), runner, sampler)
        await engine.start()
        engines.append(engine)
        return engine

    yield factory
    for engine in engines:
        await engine.close()


def prompt(n: int, start: int = 300) -> list[int]:
    return list(range(start, start + n))


async def test_loads_through_the_worker_registry_like_a_real_model(model_path: Path) -> None:
    settings = WorkerSettings(engine="torch", model=str(model_path), num_blocks=64)
    engine = build_engine(settings, load_model_dir(model_path))
    assert isinstance(engine, TorchEngine)
    await engine.start()
    try:
        outs = await collect(engine, EngineRequest("r", prompt(20), max_tokens=3, ignore_eos=True))
        assert len(tokens(outs)) == 3 and engine.info().engine == "torch" and engine.info().total_blocks == 64
    finally:
        await engine.close()


async def test_qwen2_architecture_loads_too(tmp_path: Path) -> None:
    path = build_tiny_model(tmp_path / "qwen", arch="qwen2")
    engine = TorchEngine(TorchConfig(), load_model_dir(path), ModelRunner(path))
    await engine.start()
    try:
        outs = await collect(engine, EngineRequest("q", prompt(20), max_tokens=4, ignore_eos=True))
        assert len(tokens(outs)) == 4
    finally:
        await engine.close()


@pytest.fixture(scope="module")
def plain_model(model_path: Path) -> Any:
    """The same checkpoint in plain transformers (its own SDPA attention and DynamicCache): the reference."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_path), attn_implementation="sdpa").eval()


def plain_greedy(model: Any, ids: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    return [int(t) for t in out[0, len(ids):]]


async def test_greedy_matches_plain_transformers_generate(make: Make, plain_model: Any) -> None:
    engine = await make()
    outs = await collect(engine, EngineRequest("g", prompt(25), max_tokens=10, ignore_eos=True))
    assert tokens(outs) == plain_greedy(plain_model, prompt(25), 10)


async def test_concurrent_mixed_steps_match_plain_generate_token_for_token(make: Make, plain_model: Any) -> None:
    """Prefill chunks and decodes of several requests share each step's one forward (packed, varlen): every
    request's greedy output is still plain transformers' own, a cached turn's included."""
    engine = await make(max_num_batched_tokens=48)
    first = prompt(70, 500)
    await collect(engine, EngineRequest("warm", first, max_tokens=1, ignore_eos=True))
    prompts = [first + prompt(9, 3000), prompt(33, 1200), prompt(5, 1700), prompt(90, 2200)]
    reqs = [EngineRequest(f"m{i}", p, max_tokens=12, ignore_eos=True) for i, p in enumerate(prompts)]
    results = await asyncio.gather(*(collect(engine, r) for r in reqs))
    assert results[0][-1].usage is not None and results[0][-1].usage.cached_tokens == 64
    assert [tokens(o) for o in results] == [plain_greedy(plain_model, p, 12) for p in prompts]


async def test_one_forward_per_step_for_all_scheduled_items(make: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = await make()
    calls: list[int] = []
    forward = engine.runner.forward

    def counting(token_ids: Any, positions: Any, batch: Any, keep: Any) -> torch.Tensor:
        calls.append(len(keep))
        return forward(token_ids, positions, batch, keep)

    monkeypatch.setattr(engine.runner, "forward", counting)
    reqs = [EngineRequest(f"b{i}", prompt(20, 1000 + 100 * i), max_tokens=8, ignore_eos=True) for i in range(6)]
    await asyncio.gather(*(collect(engine, r) for r in reqs))
    assert len(calls) == engine.stats().steps and max(calls) == 6  # six requests' tokens in one forward


async def test_admitting_a_cached_prefix_copies_none_of_its_kv(make: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second turn attends over the first turn's blocks where they lie in the pool: the pool stays the one
    preallocated tensor, the only slots written are the new tokens' (none in a cached block), and the cached
    blocks are bit for bit what they were."""
    engine = await make(num_blocks=64)
    first = prompt(96)
    outs = await collect(engine, EngineRequest("t1", first, max_tokens=1, ignore_eos=True))
    storage = engine.pool.kv.untyped_storage().data_ptr()
    held = _cached_block_ids(engine, [*first, 0])  # a prefix match leaves one token to compute
    assert len(held) == 6
    before = engine.pool.kv[:, :, held].clone()
    written: list[int] = []
    forward = engine.runner.forward

    def recording(token_ids: Any, positions: Any, batch: Any, keep: Any) -> torch.Tensor:
        written.extend(batch.slots.tolist())
        return forward(token_ids, positions, batch, keep)

    monkeypatch.setattr(engine.runner, "forward", recording)
    turn2 = first + tokens(outs) + prompt(20, 2000)
    outs2 = await collect(engine, EngineRequest("t2", turn2, max_tokens=3, ignore_eos=True))
    assert outs2[-1].usage is not None and outs2[-1].usage.cached_tokens == 96
    assert len(written) == len(turn2) - 96 + 2  # the suffix, then two decodes: nothing of the prefix
    assert not {slot // 16 for slot in written} & set(held)
    assert engine.pool.kv.untyped_storage().data_ptr() == storage
    assert torch.equal(engine.pool.kv[:, :, held], before)


def _cached_block_ids(engine: TorchEngine, token_ids: list[int]) -> list[int]:
    """The pool blocks holding ``token_ids``' cached full blocks (looked up by holding them for a moment)."""
    from services.kvcore.block_manager import KvSequence

    seq = KvSequence()
    engine.blocks.acquire_prefix(seq, token_ids)
    ids = engine.blocks.block_ids(seq)
    engine.blocks.free(seq)
    return ids


async def test_cache_served_logits_equal_a_cold_run(make: Make) -> None:
    warm_sampler, cold_sampler = RecordingSampler(), RecordingSampler()
    warm = await make(sampler=warm_sampler)
    cold = await make(sampler=cold_sampler)
    first = prompt(100)
    outs = await collect(warm, EngineRequest("t1", first, max_tokens=6, ignore_eos=True))
    turn2 = first + tokens(outs) + prompt(37, 2000)
    warm_outs = await collect(warm, EngineRequest("t2", turn2, max_tokens=6, ignore_eos=True))
    cold_outs = await collect(cold, EngineRequest("t2", turn2, max_tokens=6, ignore_eos=True))
    assert warm_outs[-1].usage is not None and warm_outs[-1].usage.cached_tokens == 96
    assert cold_outs[-1].usage is not None and cold_outs[-1].usage.cached_tokens == 0
    assert tokens(warm_outs) == tokens(cold_outs)
    for w, c in zip(warm_sampler.logits["t2"], cold_sampler.logits["t2"], strict=True):
        torch.testing.assert_close(w, c, rtol=0, atol=1e-4)


def test_paged_attention_refuses_to_run_outside_an_engine_step(runner: ModelRunner) -> None:
    with pytest.raises(RuntimeError, match="inside a torch engine step"), torch.inference_mode():
        runner.model(input_ids=torch.tensor([prompt(4)]), use_cache=False)


def test_forward_warns_of_nothing(runner: ModelRunner) -> None:
    """No deprecation on the hot path (transformers 5.x warns of arguments a later release removes)."""
    from services.worker.torch_engine.kv_pool import plan_batch

    pool = runner.new_pool(4, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runner.forward(prompt(8), list(range(8)), plan_batch(pool, [(0, 8, [2])]), [7])


async def test_requests_are_interleaved_per_step(make: Make) -> None:
    engine = await make()
    reqs = [EngineRequest(f"r{i}", prompt(20, 1000 + 500 * i), max_tokens=12, ignore_eos=True) for i in range(3)]
    results = await asyncio.gather(*(collect(engine, r) for r in reqs))
    assert all(len(tokens(o)) == 12 for o in results)
    assert engine.stats().steps < 2 * 12  # one after another would take 36 steps


async def test_chunked_prefill_of_a_long_prompt(make: Make) -> None:
    engine = await make(max_num_batched_tokens=64)
    outs = await collect(engine, EngineRequest("long", prompt(300), max_tokens=2, ignore_eos=True))
    assert len(tokens(outs)) == 2 and engine.stats().steps >= 300 // 64
    cold = await make()
    again = await collect(cold, EngineRequest("long", prompt(300), max_tokens=2, ignore_eos=True))
    assert tokens(again) == tokens(outs)


async def test_preemption_under_kv_pressure_keeps_outputs(make: Make) -> None:
    roomy = await make()
    reqs = [EngineRequest(f"p{i}", prompt(40, 1000 + 300 * i), max_tokens=40, ignore_eos=True) for i in range(3)]
    expected = [tokens(await collect(roomy, r)) for r in reqs]
    tight = await make(num_blocks=12)
    results = await asyncio.gather(*(collect(tight, r) for r in reqs))
    assert [tokens(o) for o in results] == expected
    assert tight.stats().preemptions > 0 and tight.stats().active_blocks == 0


async def test_prefix_sealed_in_the_same_step_is_shared_exactly(make: Make) -> None:
    # Admitted together, the later requests reuse blocks the first one's chunk seals in that very step.
    engine, cold = await make(), await make()
    reqs = [EngineRequest(f"q{i}", prompt(70) + [900 + i] * (i + 1), max_tokens=6, ignore_eos=True) for i in range(3)]
    results = await asyncio.gather(*(collect(engine, r) for r in reqs))
    assert [o[-1].usage.cached_tokens for o in results if o[-1].usage] == [0, 64, 64]
    assert [tokens(o) for o in results] == [tokens(await collect(cold, r)) for r in reqs]
    assert engine.cached_block_hashes() == set(engine.blocks.lru_order())


async def test_lru_eviction_keeps_recent_prefixes(make: Make) -> None:
    engine = await make(num_blocks=16)
    for i in range(5):  # 4 full blocks each: the fifth evicts the first
        await collect(engine, EngineRequest(f"e{i}", prompt(64, 1000 + 200 * i), max_tokens=1, ignore_eos=True))
    held = engine.cached_block_hashes()
    assert set(sequence_hashes(prompt(64, 1800), 16)) <= held
    assert not set(sequence_hashes(prompt(64, 1000), 16)) & held
    assert len(held) <= 16


async def test_seeded_sampling_is_reproducible(make: Make) -> None:
    engine = await make()
    req = EngineRequest("s1", prompt(20), max_tokens=8, ignore_eos=True, temperature=0.8, top_p=0.9, top_k=50, seed=7)
    a = tokens(await collect(engine, req))
    b = tokens(await collect(engine, EngineRequest("s2", prompt(20), max_tokens=8, ignore_eos=True,
                                                   temperature=0.8, top_p=0.9, top_k=50, seed=7)))
    assert a == b and len(a) == 8


def test_missing_weights_fail_clearly(tmp_path: Path) -> None:
    from services.common.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="cannot load a causal LM"):
        ModelRunner(tmp_path)


async def test_sliding_window_layers_match_plain_generate(tmp_path: Path) -> None:
    """A model whose layers slide (Qwen2 with ``use_sliding_window``) attends over each layer's window in the
    pool too: past the window, greedy output is still plain transformers' own (prefill chunks and decodes)."""
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    path = build_tiny_model(tmp_path / "base", arch="qwen2")
    config = Qwen2Config.from_pretrained(path)
    config.use_sliding_window, config.sliding_window, config.max_window_layers = True, 24, 1
    config.layer_types = ["full_attention", "sliding_attention"]
    torch.manual_seed(1)
    Qwen2ForCausalLM(config).save_pretrained(path)
    plain = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="sdpa").eval()
    assert plain.config.layer_types == ["full_attention", "sliding_attention"]
    engine = TorchEngine(TorchConfig(max_num_batched_tokens=32), load_model_dir(path), ModelRunner(path))
    await engine.start()
    try:
        outs = await collect(engine, EngineRequest("w", prompt(70), max_tokens=12, ignore_eos=True))
    finally:
        await engine.close()
    expected = plain_greedy(plain, prompt(70), 12)
    assert tokens(outs) == expected


def test_soft_capped_attention_is_refused_at_load(tmp_path: Path) -> None:
    from transformers import LlamaConfig

    from services.common.errors import InvalidRequestError

    path = build_tiny_model(tmp_path / "capped")
    config = LlamaConfig.from_pretrained(path)
    config.attn_logit_softcapping = 50.0
    config.save_pretrained(path)
    with pytest.raises(InvalidRequestError, match="soft-capped attention logits"):
        ModelRunner(path)
