"""The engines a worker can run, by the names users type (``--engine``). The set is API.

The names are the settings groups' (``settings.py``: ``MockerSettings.NAME`` ...); each factory hands
its engine the batching config and its own group only, and imports the engine lazily: torch and
tensorrt_llm are loaded only when selected.
"""

from __future__ import annotations

from collections.abc import Callable

from services.common.errors import InvalidRequestError, UnavailableError
from services.common.model_dir import ModelDir
from services.worker.engine import Engine
from services.worker.settings import (
    MockerSettings,
    TorchSettings,
    TrtllmGrpcSettings,
    TrtllmSettings,
    WorkerSettings,
)


def _mocker(settings: WorkerSettings, model: ModelDir) -> Engine:
    from services.worker.mocker import MockerConfig, MockerEngine
    from services.worker.mocker.script import script_for

    group = settings.mocker()
    config = MockerConfig(**vars(settings.batching()), seed=group.seed, timing=group.timing)
    script = script_for(group.script, model.path)  # --script, else the model directory's own
    return MockerEngine(config, model, script)


def _torch(settings: WorkerSettings, model: ModelDir) -> Engine:
    try:
        from services.worker.torch_engine import ModelRunner, TorchConfig, TorchEngine
    except ImportError as exc:
        raise UnavailableError(
            f"the torch engine needs PyTorch: pip install -e '.[torch]' ({exc})") from exc
    if not settings.model:
        raise InvalidRequestError("--engine torch needs --model DIR: a Hugging Face causal LM (config + weights)")
    group = settings.torch()
    runner = ModelRunner(model.path, dtype=group.dtype, threads=group.threads, device=group.device)
    return TorchEngine(TorchConfig(**vars(settings.batching())), model, runner)


def _trtllm(settings: WorkerSettings, model: ModelDir) -> Engine:
    from services.worker.trtllm import TrtllmEngine, load_llm

    if not settings.model:
        raise InvalidRequestError("--engine trtllm needs --model DIR (a Hugging Face checkpoint)")
    batching = settings.batching()
    return TrtllmEngine(load_llm(model, settings.trtllm(), batching), model, num_blocks=batching.num_blocks,
                        max_tokens_default=batching.max_tokens_default)


def _trtllm_grpc(settings: WorkerSettings, model: ModelDir) -> Engine:
    from services.worker.trtllm_grpc import TrtllmGrpcClient, TrtllmGrpcEngine

    if not settings.model:
        raise InvalidRequestError("--engine trtllm-grpc needs --model DIR: the same checkpoint trtllm-serve runs "
                                  "(our parse service tokenizes with it)")
    group, batching = settings.trtllm_grpc(), settings.batching()
    return TrtllmGrpcEngine(TrtllmGrpcClient(group.target), model, block_size=batching.block_size,
                            num_blocks=batching.num_blocks, max_tokens_default=batching.max_tokens_default,
                            connect_timeout=group.connect_timeout)


ENGINES: dict[str, Callable[[WorkerSettings, ModelDir], Engine]] = {
    MockerSettings.NAME: _mocker,
    TorchSettings.NAME: _torch,
    TrtllmSettings.NAME: _trtllm,
    TrtllmGrpcSettings.NAME: _trtllm_grpc,
}


def build_engine(settings: WorkerSettings, model: ModelDir) -> Engine:
    """The engine named by ``settings.engine``; an unknown name lists the valid ones."""
    factory = ENGINES.get(settings.engine)
    if factory is None:
        raise ValueError(f"unknown engine {settings.engine!r}; valid engines: {', '.join(sorted(ENGINES))}")
    return factory(settings, model)
