"""A live mesh for ``harnessmesh replay --live``: nats-server, one router and N mocker workers as OS processes.

The workers run the simulator's engine configuration (block size, blocks, batching limits) and its timing
model (``--timing-model dynamo``) with ``--speedup`` set to the time-compression factor, so one wall-clock
second of this mesh is ``compression`` seconds of the simulator's clock. The workers get a copy of the demo
model whose context is long enough for any trace prompt (the simulator does not bound prompt length).
This is an adapter (processes, gRPC) over the launcher's supervisor; the simulator stays free of both.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from services.common.model_dir import load_model_dir
from services.launcher.backend import start_backend
from services.launcher.nats_server import NatsServer
from services.launcher.supervisor import Supervisor, deadline_in, free_port
from services.replay.sim_worker import SimWorkerConfig
from services.router.pending import DEFAULT_PENDING_TTL
from services.router.policy import DEFAULT_OVERLAP_WEIGHT

LONG_CONTEXT = 1 << 20  # tokens: above any Mooncake prompt


@dataclass(frozen=True)
class LiveMeshConfig:
    """The mesh to start: the simulator's :class:`ReplayConfig` knobs plus the time compression."""

    workers: int = 2
    mode: str = "kv"
    worker: SimWorkerConfig = field(default_factory=SimWorkerConfig)  # each worker's capacity and batching
    overlap_weight: float = DEFAULT_OVERLAP_WEIGHT
    temperature: float = 0.0
    compression: float = 1.0
    pending_prefix_ttl: float = DEFAULT_PENDING_TTL  # simulated seconds (the router gets it / compression)
    startup_timeout: float = 60.0
    log_dir: str = ""  # children's stdout/stderr go to <log_dir>/<name>.log (empty: a temporary dir)


def long_context_model(dest: Path) -> Path:
    """A copy of the demo model (tokenizer, template) whose context is :data:`LONG_CONTEXT` tokens."""
    src = load_model_dir("").path
    dest.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_file():
            shutil.copy2(item, dest / item.name)
    config = json.loads((dest / "config.json").read_text()) if (dest / "config.json").is_file() else {}
    config["max_position_embeddings"] = LONG_CONTEXT
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    return dest


class LiveMesh:
    """Starts and stops the processes; :attr:`router_address` is where to send the trace.

    A thin driver over the launcher's :class:`Supervisor` and :func:`start_backend` (the same ones
    ``harnessmesh up`` uses): what it adds is the simulator's worker configuration. The lifecycle events
    are not logged (``replay`` prints its results on stdout); the children's logs go to ``log_dir``.
    """

    def __init__(self, config: LiveMeshConfig) -> None:
        self.config = config
        self._tmp = tempfile.TemporaryDirectory(prefix="harnessmesh-replay-")
        self.log_dir = Path(config.log_dir or self._tmp.name)
        self.supervisor = Supervisor(log_dir=self.log_dir, log=structlog.wrap_logger(structlog.ReturnLogger()))
        self.router_address = ""

    async def start(self) -> str:
        c = self.config
        deadline = deadline_in(c.startup_timeout)
        nats = NatsServer(free_port())
        self.supervisor.adopt(nats)
        await nats.start(c.startup_timeout)
        model = long_context_model(Path(self._tmp.name) / "model")
        quiet = {"log_level": "warning"}
        backend = await start_backend(
            self.supervisor, workers=c.workers, nats_url=nats.url, nats_token=nats.token, deadline=deadline,
            router_options={**quiet, "router_mode": c.mode, "overlap_weight": c.overlap_weight,
                            "router_temperature": c.temperature, "worker_timeout": 30.0, "stall_timeout": 600.0,
                            "pending_prefix_ttl": c.pending_prefix_ttl / c.compression},
            worker_options=lambda name: {
                **quiet, "engine": "mocker", "model": str(model), "block_size": c.worker.block_size,
                "num_blocks": c.worker.num_blocks, "max_num_seqs": c.worker.max_num_seqs,
                "max_num_batched_tokens": c.worker.max_num_batched_tokens, "timing_model": "dynamo",
                "prefill_order": c.worker.prefill_order,
                "speedup": c.compression, "heartbeat_interval": 0.5})
        self.router_address = backend.router.grpc_address
        return self.router_address

    async def stop(self) -> None:
        await self.supervisor.stop()
        self._tmp.cleanup()


@contextlib.asynccontextmanager
async def live_mesh(config: LiveMeshConfig) -> AsyncIterator[LiveMesh]:
    """A started :class:`LiveMesh`, stopped on exit (also when start-up fails)."""
    mesh = LiveMesh(config)
    try:
        await mesh.start()
        yield mesh
    finally:
        await mesh.stop()
