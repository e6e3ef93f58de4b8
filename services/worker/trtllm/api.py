"""The slice of TensorRT-LLM's LLM API the adapter uses, and the one place that imports ``tensorrt_llm``.

``tensorrt_llm`` is imported only by :func:`load_llm`, i.e. only when ``--engine trtllm`` is selected.
It needs NVIDIA GPUs and CUDA and is not on PyPI proper (its PyPI entry redirects to NVIDIA's
index), so the usual way to get it is NVIDIA's TensorRT-LLM container image (see ``docs/gpu.md``).
The protocols below are what the adapter relies on; the test fake (``tests/worker/fake_trtllm.py``)
implements exactly them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from services.common.errors import UnavailableError
from services.common.model_dir import ModelDir
from services.kvcore.config import BatchingConfig
from services.worker.settings import TrtllmSettings

INSTALL_HINT = (
    "the trtllm engine needs the tensorrt_llm package (NVIDIA GPU + CUDA). Run the worker in NVIDIA's "
    "TensorRT-LLM image (nvcr.io/nvidia/tensorrt-llm/release, see docs/gpu.md and compose profile 'gpu'), "
    "or on a CUDA machine: pip install tensorrt_llm --extra-index-url https://pypi.nvidia.com"
)


class CompletionOutputLike(Protocol):
    """``tensorrt_llm.llmapi.CompletionOutput``: one sequence of a request."""

    @property
    def token_ids_diff(self) -> list[int]: ...
    @property
    def finish_reason(self) -> str | None: ...


class LlmLike(Protocol):
    """``tensorrt_llm.LLM``."""

    def generate_async(self, inputs: Any, sampling_params: Any = None, *, streaming: bool = False) -> Any: ...
    def get_kv_cache_events_async(self, timeout: float | None = None) -> AsyncIterator[dict[str, Any]]: ...
    def shutdown(self) -> None: ...


@dataclass(frozen=True)
class TrtllmApi:
    """A started ``LLM`` and the ``SamplingParams`` class of the same TensorRT-LLM install."""

    llm: LlmLike
    sampling_params: Callable[..., Any]


def load_llm(model: ModelDir, options: TrtllmSettings, batching: BatchingConfig) -> TrtllmApi:
    """Import TensorRT-LLM and build ``LLM`` with block reuse and KV events on; a clear error if absent."""
    try:
        from tensorrt_llm import LLM, SamplingParams  # type: ignore[import-not-found,unused-ignore]
        from tensorrt_llm.llmapi import KvCacheConfig  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise UnavailableError(f"{INSTALL_HINT} ({exc})") from exc
    kv_cache_config = KvCacheConfig(
        enable_block_reuse=True,
        event_buffer_max_size=options.event_buffer_max_size,
        free_gpu_memory_fraction=options.free_gpu_memory_fraction,
        tokens_per_block=batching.block_size,
    )
    llm = LLM(
        model=str(model.path),
        dtype=options.dtype,
        tensor_parallel_size=options.tensor_parallel_size,
        kv_cache_config=kv_cache_config,
        max_batch_size=batching.max_num_seqs,
        max_num_tokens=batching.max_num_batched_tokens,
    )
    return TrtllmApi(llm, SamplingParams)
