"""Builds each engine for the shared conformance suite, with a view of the blocks it really holds."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from services.common.model_dir import ModelDir, load_model_dir
from services.kvcore.config import BatchingConfig
from services.kvcore.timing import TimingModel
from services.kvcore.tokens import FillerVocabulary
from services.worker.engine import Engine, EngineOutput, EngineRequest, KvCleared, KvEvent, KvRemoved, KvStored
from services.worker.mocker import MockerConfig, MockerEngine
from services.worker.settings import TrtllmSettings
from services.worker.trtllm import TrtllmEngine, load_llm
from services.worker.trtllm_grpc import TrtllmGrpcClient, TrtllmGrpcEngine
from tests.worker.fake_trtllm import FakeLLM, fake_module
from tests.worker.fake_trtllm_grpc import start_fake_server

HAS_TORCH = importlib.util.find_spec("torch") is not None
# The README's test command installs no PyTorch (from PyPI it is the CUDA build, gigabytes); .ci/run adds the CPU build.
TORCH_MISSING = ("PyTorch is not installed: the torch engine's tests need its CPU build "
                 "(pip install torch --index-url https://download.pytorch.org/whl/cpu; .ci/run installs it)")


def cuda_missing() -> str:
    """Why the torch engine cannot run on CUDA here ("" when it can); printed as the skip reason."""
    if not HAS_TORCH:
        return TORCH_MISSING
    import torch

    if not torch.cuda.is_available():
        return f"no CUDA GPU visible to PyTorch {torch.__version__} (torch.cuda.is_available() is False)"
    return ""


CUDA_MISSING = cuda_missing()
ENGINE_KINDS = [
    "mocker",
    pytest.param("torch", marks=pytest.mark.skipif(not HAS_TORCH, reason=TORCH_MISSING)),
    pytest.param("torch-cuda", marks=pytest.mark.skipif(bool(CUDA_MISSING), reason=f"torch on cuda: {CUDA_MISSING}")),
    "trtllm-fake",
    "trtllm-grpc-fake",
]
TRTLLM_OPTIONS = TrtllmSettings(tensor_parallel_size=1, free_gpu_memory_fraction=0.9, event_buffer_max_size=1024,
                                dtype="auto")


@dataclass
class Harness:
    """An engine under test, the full blocks it really holds, and the KV events it published."""

    engine: Any
    real_blocks: Callable[[], set[int]]
    events: list[KvEvent]
    _task: asyncio.Task[None]
    on_close: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def published_blocks(self) -> set[int]:
        return fold(self.events)

    async def close(self) -> None:
        await self.engine.close()
        self._task.cancel()
        for stop in self.on_close:
            await stop()


def fold(events: list[KvEvent]) -> set[int]:
    """The block set a router would hold after ``events``."""
    blocks: set[int] = set()
    for event in events:
        if isinstance(event, KvStored):
            blocks.update(b.block_hash for b in event.blocks)
        elif isinstance(event, KvRemoved):
            blocks.difference_update(event.block_hashes)
        elif isinstance(event, KvCleared):
            blocks.clear()
    return blocks


async def build(kind: str, model_path: Path, runners: dict[str, Any], *, num_blocks: int = 512,
                block_size: int = 16, max_tokens_default: int = 64, start: bool = True) -> Harness:
    model = load_model_dir(model_path)
    engine: Any
    real: Callable[[], set[int]]
    on_close: list[Callable[[], Awaitable[None]]] = []
    if kind == "mocker":
        engine = MockerEngine(MockerConfig(block_size=block_size, num_blocks=num_blocks,
                                           max_tokens_default=max_tokens_default,
                                           timing=TimingModel(speedup=1000.0)), model)
        real = lambda: set(engine.blocks.lru_order())  # noqa: E731 (all full blocks are inactive when idle)
    elif kind in ("torch", "torch-cuda"):
        from services.worker.torch_engine import ModelRunner, TorchConfig, TorchEngine

        if kind not in runners:
            runners[kind] = ModelRunner(model_path, device="cuda" if kind == "torch-cuda" else "cpu")
        engine = TorchEngine(TorchConfig(block_size=block_size, num_blocks=num_blocks,
                                         max_tokens_default=max_tokens_default), model, runners[kind])
        real = engine.cached_block_hashes
    elif kind == "trtllm-grpc-fake":
        server = await start_fake_server(model, num_blocks=num_blocks, block_size=block_size)
        on_close.append(server.stop)
        engine = TrtllmGrpcEngine(TrtllmGrpcClient(server.target), model, block_size=block_size,
                                  num_blocks=num_blocks, max_tokens_default=max_tokens_default,
                                  resubscribe=(0.01, 0.1))
        real = server.llm.cached_sequence_hashes
    else:
        batching = BatchingConfig(block_size=block_size, num_blocks=num_blocks, max_tokens_default=max_tokens_default)
        api = load_llm(model, TRTLLM_OPTIONS, batching,
                       fake_module(FillerVocabulary(model.tokenizer).words, num_blocks=num_blocks))
        engine = TrtllmEngine(api, model, num_blocks=num_blocks, max_tokens_default=max_tokens_default,
                              poll_interval=0.001, max_poll_interval=0.005)
        assert isinstance(api.llm, FakeLLM)
        real = api.llm.cached_sequence_hashes
    assert isinstance(engine, Engine)
    events: list[KvEvent] = []
    subscription = engine.kv_events()

    async def collect() -> None:
        async for batch in subscription:
            events.extend(batch)

    task = asyncio.create_task(collect())
    if start:
        await engine.start()
    return Harness(engine, real, events, task, on_close)


async def collect(engine: Any, request: EngineRequest) -> list[EngineOutput]:
    return [out async for out in engine.generate(request)]


def tokens(outs: list[EngineOutput]) -> list[int]:
    return [t for o in outs for t in o.token_ids]


async def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Whether ``condition`` holds within ``timeout`` (polled; engines publish events asynchronously)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def demo_model() -> ModelDir:
    return load_model_dir("")
