"""Settings of the worker process (``python -m services.worker``). Light to import: no model code."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.service_settings import CommonSettings
from services.common.settings import option

ENGINE_NAMES = ("mocker", "torch", "trtllm")
TIMING_MODELS = ("default", "dynamo")  # mocker step-time models (services/worker/mocker/timing.py)


@dataclass(frozen=True)
class WorkerSettings(CommonSettings):
    """A worker: one engine behind the Worker gRPC service, publishing KV events and heartbeats on NATS."""

    host: str = option("127.0.0.1", "Address the Worker gRPC service binds.", wiring=True)
    port: int = option(0, "Port of the Worker gRPC service (0: pick a free port).", wiring=True)
    advertise_host: str = option("127.0.0.1", "Host the router dials to reach this worker.", wiring=True)
    worker_id: str = option("", "Worker id on the mesh (empty: worker-<8 hex>).", wiring=True)
    engine: str = option("mocker", "Engine serving this worker.", choices=ENGINE_NAMES)
    model: str = option("", "Model directory (Hugging Face layout; empty: the repo's demo model).", shared=True)
    nats_url: str = option("nats://127.0.0.1:4222", "NATS server URL.", shared=True)
    block_size: int = option(16, "Tokens per KV block.")
    num_blocks: int = option(16384, "KV cache capacity in blocks.")
    max_num_seqs: int = option(64, "Most requests batched in one engine step.")
    max_num_batched_tokens: int = option(8192, "Token budget of one engine step (chunked prefill).")
    max_tokens_default: int = option(1024, "max_tokens when a request leaves it at 0.")
    speedup: float = option(1.0, "Mocker: divide every simulated step time by this factor.")
    timing_model: str = option(
        "default", "Mocker: step-time model. default: the prefill_*/decode_* coefficients below; dynamo: NVIDIA "
        "Dynamo mocker's polynomials (the trace-replay simulator's model; ignores those coefficients).",
        choices=TIMING_MODELS)
    script: str = option("", "Mocker: JSONL file of {\"match\": ..., \"completion\": ...} scripted completions.")
    seed: int = option(0, "Mocker: seed of the filler text generated when no script line matches.")
    prefill_ms_base: float = option(2.0, "Mocker timing: fixed ms of a step that prefills.")
    prefill_ms_per_token: float = option(0.1, "Mocker timing: ms per uncached prompt token.")
    prefill_quadratic_us: float = option(
        3.0, "Mocker timing: extra µs per prompt token per 1000 tokens of attended context.")
    decode_ms_base: float = option(12.0, "Mocker timing: fixed ms of a decode step.")
    decode_ms_per_seq: float = option(0.15, "Mocker timing: ms per sequence in a decode step.")
    decode_us_per_block: float = option(2.0, "Mocker timing: µs per active KV block in a decode step.")
    dtype: str = option("auto", "torch/trtllm: weight dtype (auto: float32 for torch on the CPU, the checkpoint's "
                        "for trtllm).", choices=("auto", "float32", "bfloat16", "float16"))
    torch_threads: int = option(0, "torch: intra-op CPU threads (0: PyTorch's default).")
    tensor_parallel_size: int = option(1, "trtllm: GPUs one worker spans (tensor parallelism).")
    free_gpu_memory_fraction: float = option(0.9, "trtllm: share of free GPU memory given to the KV cache.")
    trtllm_event_buffer: int = option(16384, "trtllm: KvCacheConfig.event_buffer_max_size (KV events buffered "
                                      "in the engine between polls).")
    heartbeat_interval: float = option(1.0, "Seconds between heartbeats on NATS.")
    event_buffer: int = option(4096, "Recently published KV events kept for replay.")

    def validate(self) -> None:
        if self.engine not in ENGINE_NAMES:
            raise ValueError(f"unknown engine {self.engine!r}; valid engines: {', '.join(ENGINE_NAMES)}")
        for name in ("block_size", "num_blocks", "max_num_seqs", "max_num_batched_tokens", "max_tokens_default"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive")
        if self.tensor_parallel_size <= 0 or self.trtllm_event_buffer <= 0:
            raise ValueError("--tensor-parallel-size and --trtllm-event-buffer must be positive")
        if not 0 < self.free_gpu_memory_fraction <= 1:
            raise ValueError("--free-gpu-memory-fraction must be in (0, 1]")
        if self.speedup <= 0:
            raise ValueError("--speedup must be positive")
        if self.timing_model not in TIMING_MODELS:
            raise ValueError(f"unknown timing model {self.timing_model!r}; valid: {', '.join(TIMING_MODELS)}")
        if self.heartbeat_interval <= 0:
            raise ValueError("--heartbeat-interval must be positive")
        if not 0 <= self.port < 65536:
            raise ValueError("--port must be in 0..65535")
