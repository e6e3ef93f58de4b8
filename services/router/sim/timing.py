"""Dynamo mocker's polynomial step-time model, the simulator's default (so results sit beside Dynamo's).

* prefill: ``4.209989e-7 * T**2 + 0.01518344 * T + 16.50142`` ms for ``T`` new tokens in the step;
* decode: ``max(1, -25.74 * u**2 + 54.01 * u + 5.74)`` ms with ``u`` the worker's KV utilisation.

A step costs its prefill plus, if any request decodes in it, one decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.worker.mocker.timing import PrefillChunk


@dataclass(frozen=True)
class PolynomialTiming:
    """Coefficients of Dynamo's mocker polynomials (``prefill = a + b*T + c*T^2``, ``decode = d + e*u + f*u^2``)."""

    prefill: tuple[float, float, float] = (16.50142, 0.01518344, 4.209989e-7)
    decode: tuple[float, float, float] = (5.74, 54.01, -25.74)

    def prefill_ms(self, new_tokens: int) -> float:
        if new_tokens <= 0:
            return 0.0
        a, b, c = self.prefill
        return a + b * new_tokens + c * new_tokens * new_tokens

    def decode_ms(self, utilisation: float) -> float:
        d, e, f = self.decode
        return max(1.0, d + e * utilisation + f * utilisation * utilisation)

    def step_ms(self, prefills: Sequence[PrefillChunk], decode_batch: int, utilisation: float) -> float:
        ms = self.prefill_ms(sum(c.new_tokens for c in prefills))
        if decode_batch:
            ms += self.decode_ms(utilisation)
        return ms
