"""Next-token choice from logits: greedy by default, temperature / top-k / top-p sampling when asked."""

from __future__ import annotations

import torch

from services.worker.engine import EngineRequest


class Sampler:
    """Picks one token per request per step. ``temperature`` unset or 0 means greedy (deterministic).

    A request with ``seed`` samples reproducibly (its own generator); the logits it saw are passed to
    :meth:`observe` first, a hook for tests and debugging (no-op here).
    """

    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}

    def observe(self, request_id: str, logits: torch.Tensor) -> None:
        """Called with the logits behind every sampled token."""

    def sample(self, request: EngineRequest, logits: torch.Tensor) -> int:
        self.observe(request.request_id, logits)
        temperature = request.temperature or 0.0
        if temperature <= 0.0:
            return int(torch.argmax(logits).item())
        scores = logits / temperature
        if request.top_k is not None and 0 < request.top_k < scores.numel():
            kth = torch.topk(scores, request.top_k).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if request.top_p is not None and 0.0 < request.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < request.top_p
            sorted_probs = sorted_probs * keep
            probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
            probs = probs / probs.sum()
        generator = self._generators.get(request.request_id)
        if generator is None:
            generator = torch.Generator()
            if request.seed is not None:
                generator.manual_seed(request.seed)
            else:
                generator.seed()
            self._generators[request.request_id] = generator
        return int(torch.multinomial(probs, 1, generator=generator).item())

    def release(self, request_id: str) -> None:
        """The request ended: forget its generator."""
        self._generators.pop(request_id, None)
