"""Settings of ``harnessmesh replay`` (the trace is its positional argument; env ``HARNESSMESH_REPLAY_<OPTION>``)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.settings import option
from services.kvcore.config import PREFILL_ORDERS
from services.replay.sim_worker import SimWorkerConfig
from services.router.footprint import DEFAULT_FOOTPRINT_WINDOW
from services.router.pending import DEFAULT_PENDING_TTL
from services.router.policy import DEFAULT_OVERLAP_WEIGHT, MODES

_WORKER = SimWorkerConfig()


@dataclass(frozen=True)
class ReplaySettings:
    """The simulated (or live) mesh to replay the trace on, the routing modes to compare, and the output."""

    workers: int = option(8, "Workers of the simulated (or --live) mesh.")
    router: str = option("kv", f"Routing mode, or several comma-separated: {', '.join(MODES)}.")
    block_size: int = option(_WORKER.block_size, "Tokens per KV block.")
    num_blocks: int = option(_WORKER.num_blocks, "KV blocks per worker.")
    max_num_seqs: int = option(_WORKER.max_num_seqs, "Most requests per engine step.")
    max_num_batched_tokens: int = option(_WORKER.max_num_batched_tokens, "Token budget per step.")
    prefill_order: str = option(_WORKER.prefill_order, "Which prompts get a step's budget first (the worker's "
                                "--prefill-order): shortest or fcfs.", choices=PREFILL_ORDERS)
    overlap_weight: float = option(DEFAULT_OVERLAP_WEIGHT, "kv cost weight of prefill blocks.")
    router_temperature: float = option(0.0, "Softmax temperature of kv placement.")
    pending_prefix_ttl: float = option(DEFAULT_PENDING_TTL, "kv: simulated seconds a placement still counts as its "
                                       "worker's prefix after its first token, as the router's --pending-prefix-ttl "
                                       "(0: off).")
    footprint_window: float = option(DEFAULT_FOOTPRINT_WINDOW, "kv: simulated seconds a session's last prompt "
                                     "counts as its worker's live footprint, as the router's --footprint-window "
                                     "(0: off).")
    retention: bool = option(True, "Simulated workers keep a session's KV through its tool wait (agent traces: a "
                                   "turn that ended in a tool call is leased, a finished sub-agent goes first; "
                                   "traces without stop reasons are unaffected).")
    speedup: float = option(1.0, "Divide the trace's arrival gaps by this factor.")
    limit: int = option(0, "Replay only the first N requests (0: all).")
    live: bool = option(False, "Replay against a live mesh of mocker workers started for each mode instead of "
                               "simulating.")
    compression: float = option(1.0, "Live: simulated seconds per wall-clock second (the workers' --speedup).")
    router_address: str = option("", "Replay against this live router instead of simulating.")
    log_dir: str = option("", "--live: keep the mesh processes' logs here.")
    json: bool = option(False, "Print one JSON object (per mode) instead of text.")

    def worker(self) -> SimWorkerConfig:
        """Each simulated (or live) worker's capacity and batching limits."""
        return SimWorkerConfig(block_size=self.block_size, num_blocks=self.num_blocks, max_num_seqs=self.max_num_seqs,
                               max_num_batched_tokens=self.max_num_batched_tokens, prefill_order=self.prefill_order)

    @property
    def modes(self) -> list[str]:
        """The routing modes of ``--router``, in order."""
        return [m.strip() for m in self.router.split(",") if m.strip()]

    def validate(self) -> None:
        unknown = [m for m in self.modes if m not in MODES]
        if unknown or not self.modes:
            raise ValueError(f"unknown routing mode(s) {unknown}; valid modes: {', '.join(MODES)}")
        if self.pending_prefix_ttl < 0 or self.footprint_window < 0:
            raise ValueError("--pending-prefix-ttl and --footprint-window must be >= 0")
        if self.speedup <= 0 or self.workers < 1 or self.compression <= 0:
            raise ValueError("--speedup and --compression must be > 0 and --workers >= 1")
