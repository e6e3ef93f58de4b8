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

:class:`DynamoTiming` is the other model (``--timing-model dynamo``): NVIDIA Dynamo mocker's polynomials,
also the trace-replay simulator's model, so a live mesh of mockers and the simulator time steps identically.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from services.kvcore.config import BatchingConfig


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


@dataclass(frozen=True)
class DynamoTiming:
    """Dynamo mocker's polynomial step-time model; the simulator's and ``--timing-model dynamo``'s (one code).

    * prefill: ``4.209989e-7 * T**2 + 0.01518344 * T + 16.50142`` ms for ``T`` new tokens in the step
      (summed over the step's prefill chunks; cached tokens cost nothing);
    * decode: ``max(1, -25.74 * u**2 + 54.01 * u + 5.74)`` ms with ``u`` the KV utilisation
      (active blocks / ``num_blocks``), added once if any request decodes in the step.

    ``speedup`` divides both (:meth:`step_seconds`; :meth:`step_ms` is unscaled, the simulator's clock).
    """

    prefill: tuple[float, float, float] = (16.50142, 0.01518344, 4.209989e-7)  # a + b*T + c*T^2
    decode: tuple[float, float, float] = (5.74, 54.01, -25.74)  # d + e*u + f*u^2
    num_blocks: int = BatchingConfig.num_blocks
    speedup: float = 1.0

    def __post_init__(self) -> None:
        if self.speedup <= 0:
            raise ValueError("speedup must be positive")
        if self.num_blocks <= 0:
            raise ValueError("num_blocks must be positive")

    def prefill_ms(self, new_tokens: int) -> float:
        """Unscaled time to prefill ``new_tokens`` tokens in one step (0 for none)."""
        if new_tokens <= 0:
            return 0.0
        a, b, c = self.prefill
        return a + b * new_tokens + c * new_tokens * new_tokens

    def decode_ms(self, utilisation: float) -> float:
        """Unscaled time of one decode step at KV utilisation ``utilisation`` (floored at 1 ms)."""
        d, e, f = self.decode
        return max(1.0, d + e * utilisation + f * utilisation * utilisation)

    def step_ms(self, prefills: Sequence[PrefillChunk], decode_batch: int, utilisation: float) -> float:
        """Unscaled time of one step: its prefill plus, if anything decodes, one decode."""
        ms = self.prefill_ms(sum(c.new_tokens for c in prefills))
        if decode_batch > 0:
            ms += self.decode_ms(utilisation)
        return ms

    def step_seconds(self, prefills: Sequence[PrefillChunk], decode_batch: int, active_blocks: int) -> float:
        """Wall time of one step, ``speedup`` applied (the live mocker's clock)."""
        return self.step_ms(prefills, decode_batch, active_blocks / self.num_blocks) / 1000.0 / self.speedup


class StepTiming(Protocol):
    """What a simulated step (the mocker's, the simulator's) needs of a timing model."""

    def step_seconds(self, prefills: Sequence[PrefillChunk], decode_batch: int, active_blocks: int) -> float: ...
