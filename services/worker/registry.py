"""The engines a worker can run, by the names users type (``--engine``). The set is API.

Each factory imports its engine lazily: torch and tensorrt_llm are loaded only when selected.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from services.common.errors import InvalidRequestError, UnavailableError
from services.common.model_dir import ModelDir
from services.worker.engine import BatchingConfig, Engine
from services.worker.settings import WorkerSettings


def _mocker(settings: WorkerSettings, model: ModelDir) -> Engine:
    from services.worker.mocker import MockerConfig, MockerEngine
    from services.worker.mocker.script import Script
    from services.worker.mocker.timing import DynamoTiming, StepTiming, TimingModel

    timing: StepTiming
    if settings.timing_model == "dynamo":
        timing = DynamoTiming(num_blocks=settings.num_blocks, speedup=settings.speedup)
    else:
        timing = TimingModel(
            prefill_ms_base=settings.prefill_ms_base,
            prefill_ms_per_token=settings.prefill_ms_per_token,
            prefill_quadratic_us=settings.prefill_quadratic_us,
            decode_ms_base=settings.decode_ms_base,
            decode_ms_per_seq=settings.decode_ms_per_seq,
            decode_us_per_block=settings.decode_us_per_block,
            speedup=settings.speedup,
        )
    config = MockerConfig(**_batching(settings), seed=settings.seed, timing=timing)
    script = Script.load(settings.script) if settings.script else None
    return MockerEngine(config, model, script)


def _batching(settings: WorkerSettings) -> dict[str, int]:
    """The :class:`BatchingConfig` fields, as the worker's settings give them."""
    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(BatchingConfig)}


def _torch(settings: WorkerSettings, model: ModelDir) -> Engine:
    try:
        from services.worker.torch_engine import ModelRunner, TorchConfig, TorchEngine
    except ImportError as exc:
        raise UnavailableError(
            f"the torch engine needs PyTorch: pip install -e '.[torch]' ({exc})") from exc
    if not settings.model:
        raise InvalidRequestError("--engine torch needs --model DIR: a Hugging Face causal LM (config + weights)")
    dtype = "float32" if settings.dtype == "auto" else settings.dtype
    runner = ModelRunner(model.path, dtype=dtype, threads=settings.torch_threads)
    config = TorchConfig(**_batching(settings))
    return TorchEngine(config, model, runner)


def _trtllm(settings: WorkerSettings, model: ModelDir) -> Engine:
    from services.worker.trtllm import TrtllmEngine, TrtllmOptions, load_llm

    if not settings.model:
        raise InvalidRequestError("--engine trtllm needs --model DIR (a Hugging Face checkpoint)")
    options = TrtllmOptions(
        block_size=settings.block_size,
        tensor_parallel_size=settings.tensor_parallel_size,
        free_gpu_memory_fraction=settings.free_gpu_memory_fraction,
        event_buffer_max_size=settings.trtllm_event_buffer,
        dtype=settings.dtype,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
    )
    return TrtllmEngine(load_llm(model, options), model, block_size=settings.block_size,
                        num_blocks=settings.num_blocks, max_tokens_default=settings.max_tokens_default)


ENGINES: dict[str, Callable[[WorkerSettings, ModelDir], Engine]] = {
    "mocker": _mocker,
    "torch": _torch,
    "trtllm": _trtllm,
}


def build_engine(settings: WorkerSettings, model: ModelDir) -> Engine:
    """The engine named by ``settings.engine``; an unknown name lists the valid ones."""
    factory = ENGINES.get(settings.engine)
    if factory is None:
        raise ValueError(f"unknown engine {settings.engine!r}; valid engines: {', '.join(sorted(ENGINES))}")
    return factory(settings, model)
