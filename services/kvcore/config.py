"""Paged-KV capacity and continuous-batching limits: the one definition of their names and defaults.

The worker's flags (``--block-size`` ...) take their defaults from here, and the replay simulator's
``SimWorkerConfig`` is this class with the simulator's own defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFILL_ORDERS = ("shortest", "fcfs")  # which prefills get a step's budget first (scheduler.py)


@dataclass(frozen=True)
class BatchingConfig:
    """Paged-KV capacity and continuous-batching limits of one engine core."""

    block_size: int = 16                      # tokens per KV block
    num_blocks: int = 16384                   # KV cache capacity in blocks
    max_num_seqs: int = 64                    # most requests batched in one step
    max_num_batched_tokens: int = 8192        # token budget of one step (chunked prefill)
    max_tokens_default: int = 1024            # max_tokens when a request leaves it at 0
    retention: bool = True                    # honour requests' retention hints (services/kvcore/retention.py)
    prefill_order: str = "shortest"           # which prefills get a step's budget first (scheduler.py)

    def __post_init__(self) -> None:
        for name in ("block_size", "num_blocks", "max_num_seqs", "max_num_batched_tokens", "max_tokens_default"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.prefill_order not in PREFILL_ORDERS:
            raise ValueError(f"prefill_order must be one of {', '.join(PREFILL_ORDERS)}, not {self.prefill_order!r}")

    @property
    def capacity_tokens(self) -> int:
        """Tokens the whole cache holds."""
        return self.num_blocks * self.block_size
