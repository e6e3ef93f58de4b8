"""How long a simulated engine step takes: a small analytic model of one GPU serving a mid-size model.

Defaults resemble an 8B-class model on one H100-class GPU:

* prefill: ``prefill_ms_base + prefill_ms_per_token * new + prefill_quadratic_us / 1000 * new * ctx / 1000``
  where ``new`` are the uncached prompt tokens computed this step and ``ctx`` the tokens they attend
  to (cached + new). Cached tokens are therefore cheaper than new ones, and long contexts cost more
  per token (attention grows with context).
* decode: ``decode_ms_base + decode_ms_per_seq * batch + decode_us_per_block / 1000 * active_blocks``
  (weights are read once per step; KV reads grow with the blocks the batch attends to).

A step that mixes chunks of prefill with decodes costs the sum (the prefill base once per step).
``speedup`` divides everything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PrefillChunk:
    """Prompt tokens computed in one step for one request."""

    new_tokens: int
    context_tokens: int  # tokens attended to, including ``new_tokens`` (cached prefix + new)


@dataclass(frozen=True)
class TimingModel:
    """Coefficients of the step-time model (milliseconds unless the name says ``us``)."""

    prefill_ms_base: float = 2.0
    prefill_ms_per_token: float = 0.1
    prefill_quadratic_us: float = 3.0   # extra µs per new token per 1000 tokens of attended context
    decode_ms_base: float = 12.0
    decode_ms_per_seq: float = 0.15
    decode_us_per_block: float = 2.0
    speedup: float = 1.0

    def __post_init__(self) -> None:
        if self.speedup <= 0:
            raise ValueError("speedup must be positive")
        for name in ("prefill_ms_base", "prefill_ms_per_token", "prefill_quadratic_us", "decode_ms_base",
                     "decode_ms_per_seq", "decode_us_per_block"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")

    def prefill_ms(self, new_tokens: int, context_tokens: int | None = None) -> float:
        """Unscaled time to compute ``new_tokens`` prompt tokens attending to ``context_tokens``."""
        if new_tokens <= 0:
            return 0.0
        return self.prefill_ms_base + self._prefill_tokens_ms(new_tokens, context_tokens)

    def _prefill_tokens_ms(self, new_tokens: int, context_tokens: int | None) -> float:
        ctx = new_tokens if context_tokens is None else max(context_tokens, new_tokens)
        quadratic = self.prefill_quadratic_us / 1000.0 * new_tokens * ctx / 1000.0
        return self.prefill_ms_per_token * new_tokens + quadratic

    def decode_ms(self, batch_size: int, active_blocks: int) -> float:
        """Unscaled time of one decode step for ``batch_size`` sequences holding ``active_blocks``."""
        if batch_size <= 0:
            return 0.0
        return (self.decode_ms_base + self.decode_ms_per_seq * batch_size
                + self.decode_us_per_block / 1000.0 * active_blocks)

    def step_seconds(self, prefills: Sequence[PrefillChunk], decode_batch: int, active_blocks: int) -> float:
        """Wall time of one step, ``speedup`` applied."""
        chunks = [c for c in prefills if c.new_tokens > 0]
        ms = self.prefill_ms_base if chunks else 0.0  # one forward pass per step, whatever the mix
        ms += sum(self._prefill_tokens_ms(c.new_tokens, c.context_tokens) for c in chunks)
        ms += self.decode_ms(decode_batch, active_blocks)
        return ms / 1000.0 / self.speedup
