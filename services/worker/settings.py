"""Settings of the worker process (``python -m services.worker``). Light to import: no model code.

The flags are flat (``--speedup``, ``--dtype``, ...: names and env vars are API); each engine is handed
only its own frozen group built from them: :meth:`WorkerSettings.batching` for the engine core,
:meth:`WorkerSettings.mocker`, :meth:`WorkerSettings.torch`, :meth:`WorkerSettings.trtllm`,
:meth:`WorkerSettings.trtllm_grpc`. Each group's
``NAME`` is the engine's ``--engine`` name (the one definition of those names).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from services.common import worker_registry as registry
from services.common.service_settings import MeshServiceSettings
from services.common.settings import option
from services.kvcore.config import PREFILL_ORDERS, BatchingConfig
from services.kvcore.timing import DynamoTiming, StepTiming, TimingModel

TIMING_MODELS = ("default", "dynamo")  # mocker step-time models (services/kvcore/timing.py)
_BATCHING = BatchingConfig()            # the batching defaults (services/kvcore/config.py)
_TIMING = TimingModel()                 # the default timing model's coefficients


@dataclass(frozen=True)
class MockerSettings:
    """The mocker's group: its step-time model, scripted completions and filler seed (no defaults: the
    worker's options are the one place those are written)."""

    NAME: ClassVar[str] = "mocker"
    DEFAULT_BLOCK_SIZE: ClassVar[int] = _BATCHING.block_size

    timing: StepTiming
    script: str                         # JSONL file of scripted completions ("": the model directory's, if any)
    seed: int                           # seed of the filler text


@dataclass(frozen=True)
class TorchSettings:
    """The torch engine's group: weight dtype, CPU threads and the device the model runs on."""

    NAME: ClassVar[str] = "torch"
    DEFAULT_BLOCK_SIZE: ClassVar[int] = _BATCHING.block_size

    dtype: str                          # "auto" resolved: float32
    threads: int                        # intra-op threads (0: PyTorch's default)
    device: str                         # "cpu", "cuda" or "cuda:N"


@dataclass(frozen=True)
class TrtllmSettings:
    """The TensorRT-LLM engine's group: parallelism, KV memory share, event buffer, dtype.

    Always on, not options: chunked prefill (``enable_chunked_prefill``: without it TensorRT-LLM refuses any
    prompt over ``max_num_tokens``), iteration stats (``enable_iter_perf_stats``: the load signal), and
    ``skip_tokenizer_init`` (the parse service owns tokenization; EOS / pad ids come from our model directory).
    """

    NAME: ClassVar[str] = "trtllm"
    DEFAULT_BLOCK_SIZE: ClassVar[int] = 32  # KvCacheConfig.tokens_per_block's default (and NVIDIA Dynamo's)

    tensor_parallel_size: int           # GPUs one worker spans
    free_gpu_memory_fraction: float     # share of free GPU memory given to the KV cache
    event_buffer_max_size: int          # KvCacheConfig.event_buffer_max_size
    dtype: str                          # "auto": the checkpoint's


@dataclass(frozen=True)
class TrtllmGrpcSettings:
    """The ``trtllm-grpc`` engine's group: where the ``trtllm-serve --grpc`` server listens (``host:port``).

    The server (``tensorrt_llm/grpc/smg/server.py``) binds an insecure port and takes no credentials, so the
    address must be one only this worker reaches: loopback, or a private pod / container network.
    """

    NAME: ClassVar[str] = "trtllm-grpc"
    DEFAULT_BLOCK_SIZE: ClassVar[int] = 32  # trtllm-serve's KvCacheConfig.tokens_per_block default

    target: str                         # host:port of TrtllmService
    connect_timeout: float              # seconds start() waits for the server to answer HealthCheck "OK"


ENGINE_GROUPS = (MockerSettings, TorchSettings, TrtllmSettings, TrtllmGrpcSettings)
ENGINE_NAMES = tuple(group.NAME for group in ENGINE_GROUPS)


@dataclass(frozen=True)
class WorkerSettings(MeshServiceSettings):
    """A worker: one engine behind the Worker gRPC service, publishing KV events and heartbeats on NATS."""

    host: str = option("127.0.0.1", "Address the Worker gRPC service binds.", wiring=True)
    port: int = option(0, "Port of the Worker gRPC service (0: pick a free port).", wiring=True)
    advertise_host: str = option("127.0.0.1", "Host the router dials to reach this worker.", wiring=True)
    worker_id: str = option("", "Worker id on the mesh (empty: worker-<8 hex>).", wiring=True)
    engine: str = option(MockerSettings.NAME, "Engine serving this worker.", choices=ENGINE_NAMES)
    model: str = option("", "Model directory (Hugging Face layout; empty: the repo's demo model).", shared=True)
    nats_url: str = option("nats://127.0.0.1:4222", "NATS server URL.", shared=True)
    max_model_len: int = option(0, "Context length in tokens (0: from the model's config); the parse service "
                                "and the workers both use it.", shared=True)
    nats_token: str = option("", "Token the NATS server requires (HARNESSMESH_NATS_TOKEN; `harnessmesh up` makes "
                             "one for the nats-server it starts).", shared=True, secret=True)
    block_size: int = option(
        0, "Tokens per KV block (0: the engine's default: 16 for mocker and torch, 32 for trtllm and trtllm-grpc, "
        "TensorRT-LLM's own; trtllm-grpc: must equal the server's tokens_per_block). Workers of one model should "
        "agree (the router compares prefixes only among equal block sizes); "
        "trtllm refuses to start when the engine runs with another size than the one asked for.")
    num_blocks: int = option(_BATCHING.num_blocks, "KV cache capacity in blocks.")
    max_num_seqs: int = option(_BATCHING.max_num_seqs, "Most requests batched in one engine step.")
    max_num_batched_tokens: int = option(
        _BATCHING.max_num_batched_tokens, "Token budget of one engine step (chunked prefill; trtllm: the LLM's "
        "max_num_tokens, with chunked prefill on so longer prompts are prefilled in chunks).")
    max_tokens_default: int = option(_BATCHING.max_tokens_default, "max_tokens when a request leaves it at 0.")
    retention: bool = option(_BATCHING.retention, "Honour requests' KV retention hints (a session waiting on a "
                             "tool keeps its blocks ahead of finished turns; soft leases, docs/agent-kv.md).")
    prefill_order: str = option(
        _BATCHING.prefill_order, "Which prompts get an engine step's token budget first: shortest (fewest tokens left "
        "to compute: an agent's next turn is not queued behind a cold long prompt) or fcfs (admission order); "
        "mocker and torch engines.", choices=PREFILL_ORDERS)
    speedup: float = option(_TIMING.speedup, "Mocker: divide every simulated step time by this factor.")
    timing_model: str = option(
        "default", "Mocker: step-time model. default: the prefill_*/decode_* coefficients below; dynamo: NVIDIA "
        "Dynamo mocker's polynomials (the trace-replay simulator's model; ignores those coefficients).",
        choices=TIMING_MODELS)
    script: str = option("", "Mocker: JSONL file of {\"match\": ..., \"completion\": ...} scripted completions "
                         "(empty: the model directory's mocker_script.jsonl if it has one, as the demo model does).")
    seed: int = option(0, "Mocker: seed of the filler text generated when no script line matches.")
    prefill_ms_base: float = option(_TIMING.prefill_ms_base, "Mocker timing: fixed ms of a step that prefills.")
    prefill_ms_per_token: float = option(_TIMING.prefill_ms_per_token, "Mocker timing: ms per uncached prompt token.")
    prefill_quadratic_us: float = option(
        _TIMING.prefill_quadratic_us, "Mocker timing: extra µs per prompt token per 1000 tokens of attended context.")
    decode_ms_base: float = option(_TIMING.decode_ms_base, "Mocker timing: fixed ms of a decode step.")
    decode_ms_per_seq: float = option(_TIMING.decode_ms_per_seq, "Mocker timing: ms per sequence in a decode step.")
    decode_us_per_block: float = option(
        _TIMING.decode_us_per_block, "Mocker timing: µs per active KV block in a decode step.")
    dtype: str = option("auto", "torch/trtllm: weight dtype (auto: float32 for torch on the CPU, the checkpoint's "
                        "for trtllm).", choices=("auto", "float32", "bfloat16", "float16"))
    torch_threads: int = option(0, "torch: intra-op CPU threads (0: PyTorch's default).")
    device: str = option("cpu", "torch: device the model runs on: cpu, cuda or cuda:N (a GPU PyTorch sees).")
    tensor_parallel_size: int = option(1, "trtllm: GPUs one worker spans (tensor parallelism).")
    free_gpu_memory_fraction: float = option(0.9, "trtllm: share of free GPU memory given to the KV cache.")
    trtllm_event_buffer: int = option(16384, "trtllm: KvCacheConfig.event_buffer_max_size (KV events buffered "
                                      "in the engine between polls).")
    trtllm_grpc_target: str = option(
        "127.0.0.1:8003", "trtllm-grpc: host:port of the `trtllm-serve --grpc` server (TensorRT-LLM's TrtllmService; "
        "no TLS: keep it on loopback or a private network).")
    trtllm_grpc_connect_timeout: float = option(
        600.0, "trtllm-grpc: seconds the worker waits at start for the server's HealthCheck to answer OK (it loads "
        "the model first).")
    heartbeat_interval: float = option(1.0, "Seconds between heartbeats on NATS.")
    registry_store: str = registry.store_option()
    registry_bucket: str = registry.bucket_option()
    registry_replicas: int = option(
        1, "jetstream registry: copies of the bucket in a JetStream cluster (3 for a 3-node cluster).")
    drain_grace: float = option(
        5.0, "Seconds in-flight streams get to finish when the worker is stopped (SIGTERM/SIGINT): it first "
        "announces it is leaving (the router sends it nothing new), then serves what it has, then exits. "
        "Under `harnessmesh up` the launcher waits up to 10 s per child.")
    event_buffer: int = option(4096, "Recently published KV events kept for replay.")
    kv_events_linger_ms: float = option(
        5.0, "Least milliseconds between two KV event publishes: what the engine emits meanwhile goes in one "
        "NATS message (the first events after a quiet spell go at once; 0: one message per engine step).")

    # -- the groups each engine is given ------------------------------------------------------------

    def batching(self) -> BatchingConfig:
        """Capacity and batching limits (every engine; TensorRT-LLM uses its block size and limits).

        ``--block-size 0`` becomes the selected engine's default (its group's ``DEFAULT_BLOCK_SIZE``).
        """
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(BatchingConfig)}
        if not values["block_size"]:
            group = next((g for g in ENGINE_GROUPS if self.engine == g.NAME), MockerSettings)
            values["block_size"] = group.DEFAULT_BLOCK_SIZE
        return BatchingConfig(**values)

    def mocker(self) -> MockerSettings:
        timing: StepTiming
        if self.timing_model == "dynamo":
            timing = DynamoTiming(num_blocks=self.num_blocks, speedup=self.speedup)
        else:
            timing = TimingModel(**{f.name: getattr(self, f.name) for f in dataclasses.fields(TimingModel)})
        return MockerSettings(timing, script=self.script, seed=self.seed)

    def torch(self) -> TorchSettings:
        return TorchSettings(dtype="float32" if self.dtype == "auto" else self.dtype, threads=self.torch_threads,
                             device=self.device)

    def trtllm(self) -> TrtllmSettings:
        return TrtllmSettings(tensor_parallel_size=self.tensor_parallel_size,
                              free_gpu_memory_fraction=self.free_gpu_memory_fraction,
                              event_buffer_max_size=self.trtllm_event_buffer, dtype=self.dtype)

    def trtllm_grpc(self) -> TrtllmGrpcSettings:
        return TrtllmGrpcSettings(target=self.trtllm_grpc_target, connect_timeout=self.trtllm_grpc_connect_timeout)

    def validate(self) -> None:
        super().validate()
        if self.engine not in ENGINE_NAMES:
            raise ValueError(f"unknown engine {self.engine!r}; valid engines: {', '.join(ENGINE_NAMES)}")
        if self.block_size < 0:
            raise ValueError("--block-size must be positive (or 0: the engine's default)")
        for name in ("num_blocks", "max_num_seqs", "max_num_batched_tokens", "max_tokens_default"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive")
        if not (self.device == "cpu" or self.device == "cuda" or
                (self.device.startswith("cuda:") and self.device[5:].isdigit())):
            raise ValueError(f"--device must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.tensor_parallel_size <= 0 or self.trtllm_event_buffer <= 0:
            raise ValueError("--tensor-parallel-size and --trtllm-event-buffer must be positive")
        host, _, port = self.trtllm_grpc_target.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--trtllm-grpc-target must be host:port, got {self.trtllm_grpc_target!r}")
        if self.trtllm_grpc_connect_timeout <= 0:
            raise ValueError("--trtllm-grpc-connect-timeout must be positive")
        if not 0 < self.free_gpu_memory_fraction <= 1:
            raise ValueError("--free-gpu-memory-fraction must be in (0, 1]")
        if self.speedup <= 0:
            raise ValueError("--speedup must be positive")
        if self.timing_model not in TIMING_MODELS:
            raise ValueError(f"unknown timing model {self.timing_model!r}; valid: {', '.join(TIMING_MODELS)}")
        if self.heartbeat_interval <= 0:
            raise ValueError("--heartbeat-interval must be positive")
        if self.kv_events_linger_ms < 0:
            raise ValueError("--kv-events-linger-ms must not be negative")
        if self.registry_replicas < 1:
            raise ValueError("--registry-replicas must be at least 1")
        if self.drain_grace < 0:
            raise ValueError("--drain-grace must be >= 0")
        if not 0 <= self.port < 65536:
            raise ValueError("--port must be in 0..65535")
