"""The slice of TensorRT-LLM's LLM API the adapter uses, and the one place that imports ``tensorrt_llm``.

``tensorrt_llm`` is imported only by :func:`import_tensorrt_llm`, i.e. only when ``--engine trtllm`` is
selected. It needs NVIDIA GPUs and CUDA and is not on PyPI proper (its PyPI entry redirects to NVIDIA's
index), so the usual way to get it is NVIDIA's TensorRT-LLM container image (see ``docs/gpu.md``).
The protocols below are what the adapter relies on; the test fake (``tests/worker/fake_trtllm.py``)
implements exactly them.

:func:`load_llm` builds the ``LLM`` the way a worker of this mesh needs it (each choice is a lesson of a
first run on a GPU, issue 17):

* ``enable_chunked_prefill=True`` and ``max_num_tokens`` = ``--max-num-batched-tokens``: without chunked
  prefill the PyTorch backend refuses every prompt longer than ``max_num_tokens`` (8,192 by default) in
  ``LLM._check_arguments`` -- most agent turns.
* ``enable_iter_perf_stats=True``: without it there are no iteration stats, so no ``kvCacheStats`` and
  the load signal (``active_blocks``) would read 0.
* ``skip_tokenizer_init=True`` and ``end_id`` / ``pad_id`` from *our* model directory on every request:
  the parse service owns tokenization, and TensorRT-LLM must not fail on a tokenizer it cannot load.
* ``KvCacheConfig(tokens_per_block=block size)``, then the block size the engine really runs with is read
  back (``llm.args.kv_cache_config.tokens_per_block``): a mismatch refuses to start, because every block
  hash the worker publishes is over that many tokens.
"""

from __future__ import annotations

import contextlib
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

    def generate_async(self, inputs: Any, sampling_params: Any = None, *, streaming: bool = False,
                       kv_cache_retention_config: Any = None) -> Any: ...
    def get_kv_cache_events_async(self, timeout: float | None = None) -> AsyncIterator[dict[str, Any]]: ...
    def get_stats_async(self, timeout: float | None = None) -> AsyncIterator[Any]: ...
    def shutdown(self) -> None: ...


@dataclass(frozen=True)
class TrtllmModule:
    """The classes of one TensorRT-LLM install the adapter builds on (``tensorrt_llm``'s, or the test fake's)."""

    llm: Callable[..., LlmLike]  # tensorrt_llm.LLM
    sampling_params: Callable[..., Any]  # tensorrt_llm.SamplingParams
    kv_cache_config: Callable[..., Any]  # tensorrt_llm.llmapi.KvCacheConfig
    kv_cache_retention_config: Callable[..., Any] | None = None  # tensorrt_llm.llmapi.KvCacheRetentionConfig


@dataclass(frozen=True)
class TrtllmApi:
    """A started ``LLM``, the ``SamplingParams`` class of the same install, and the facts the adapter needs.

    ``block_size``: the tokens per KV block the engine really runs with. ``end_id`` / ``pad_id``: from our
    model directory, passed on every request (TensorRT-LLM has no tokenizer to take them from).
    """

    llm: LlmLike
    sampling_params: Callable[..., Any]
    block_size: int
    end_id: int
    pad_id: int
    retention_config: Callable[..., Any] | None = None  # KvCacheRetentionConfig (None: requests carry none)


def import_tensorrt_llm() -> TrtllmModule:
    """TensorRT-LLM's classes; :class:`UnavailableError` with the install hint when it is not installed."""
    try:
        from tensorrt_llm import LLM, SamplingParams  # type: ignore[import-not-found,unused-ignore]
        from tensorrt_llm.llmapi import KvCacheConfig  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise UnavailableError(f"{INSTALL_HINT} ({exc})") from exc
    try:
        from tensorrt_llm.llmapi import KvCacheRetentionConfig  # type: ignore[import-not-found,unused-ignore]
    except ImportError:  # an install without priority-based eviction: hints are not passed on
        KvCacheRetentionConfig = None
    return TrtllmModule(LLM, SamplingParams, KvCacheConfig, KvCacheRetentionConfig)


def special_ids(model: ModelDir) -> tuple[int | None, int | None]:
    """``(end_id, pad_id)`` from the model directory: the first EOS id; the pad token's id, else ``end_id``.

    The other EOS ids (a chat model often has several) go to every request as ``stop_token_ids``.
    """
    end_id = model.eos_token_ids[0] if model.eos_token_ids else None
    pad = model.config.get("pad_token_id")
    if not isinstance(pad, int):
        text = model.special_tokens.get("pad_token")
        pad = model.tokenizer.token_to_id(text) if text is not None else None
    return end_id, pad if isinstance(pad, int) else end_id


def engine_block_size(llm: Any, asked: int) -> int:
    """The tokens per block the built ``LLM`` runs with (``llm.args.kv_cache_config``); ``asked`` if unknown."""
    args = getattr(llm, "args", None)
    config = getattr(args, "kv_cache_config", None)
    value = getattr(config, "tokens_per_block", None)
    return value if isinstance(value, int) and value > 0 else asked


def load_llm(
    model: ModelDir, options: TrtllmSettings, batching: BatchingConfig, module: TrtllmModule | None = None
) -> TrtllmApi:
    """Build ``LLM`` for this mesh (see module docstring); refuse an engine block size other than asked."""
    end_id, pad_id = special_ids(model)
    if end_id is None or pad_id is None:
        raise UnavailableError(
            f"the model directory {str(model.path)!r} names no EOS token id (eos_token_id in config.json or "
            "generation_config.json, eos_token in tokenizer_config.json): TensorRT-LLM runs without a tokenizer "
            "here and needs end_id"
        )
    trt = module if module is not None else import_tensorrt_llm()
    kv_cache_config = trt.kv_cache_config(
        enable_block_reuse=True,
        event_buffer_max_size=options.event_buffer_max_size,
        free_gpu_memory_fraction=options.free_gpu_memory_fraction,
        tokens_per_block=batching.block_size,
    )
    llm = trt.llm(
        model=str(model.path),
        dtype=options.dtype,
        tensor_parallel_size=options.tensor_parallel_size,
        kv_cache_config=kv_cache_config,
        max_batch_size=batching.max_num_seqs,
        max_num_tokens=batching.max_num_batched_tokens,
        enable_chunked_prefill=True,
        enable_iter_perf_stats=True,
        skip_tokenizer_init=True,
    )
    real = engine_block_size(llm, batching.block_size)
    if real != batching.block_size:
        with contextlib.suppress(Exception):
            llm.shutdown()
        raise UnavailableError(
            f"TensorRT-LLM runs this model with {real} tokens per KV block, not the {batching.block_size} asked "
            f"for: start the worker with --block-size {real} (and every worker of this model with the same size; "
            "the router compares cached prefixes only between equal block sizes)"
        )
    return TrtllmApi(llm, trt.sampling_params, real, end_id, pad_id,
                     trt.kv_cache_retention_config if batching.retention else None)
