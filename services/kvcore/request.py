"""Per-request state of the core: its KV sequence, its tokens, what the consumer has not read yet."""

from __future__ import annotations

import itertools
import time

from tokenizers import Tokenizer

from services.kvcore.block_manager import KvSequence
from services.kvcore.domain import PromptInfo
from services.kvcore.outputs import CheckedRequest, OutputBuffer
from services.kvcore.stops import StopStringMatcher
from services.kvcore.tokens import TokenSource

_admission_counter = itertools.count()


class CoreRequest(OutputBuffer):
    """A request inside an engine core: scheduler state on top of the output buffer.

    ``all_tokens`` is the prompt plus every generated token (recomputed after a preemption); the KV
    sequence ``seq`` holds the tokens whose KV blocks are taken. A request with a ``source`` (simulated
    engines) knows each token before the step that generates it; without one the engine's compute
    samples it. ``engine_state`` is the compute's own per-request state (the torch engine's KV cache
    tensors); the core drops it (``None``) whenever the request loses its blocks.
    """

    def __init__(
        self,
        checked: CheckedRequest,
        *,
        tokenizer: Tokenizer,
        source: TokenSource | None = None,
        block_hashes: list[int] | None = None,
    ) -> None:
        """``block_hashes``: the prompt's chained block hashes at the engine's block size, when the caller
        has them already (the simulator: the router's placement computed them); the request's KV sequence
        takes the list over and extends it as the request grows."""
        request = checked.request
        super().__init__(request, max_tokens=checked.max_tokens, stop_ids=checked.stop_ids,
                         matcher=StopStringMatcher(tokenizer, request.stop))
        self.all_tokens: list[int] = list(request.token_ids)  # prompt + generated (recomputed on preemption)
        self.source = source
        self.seq = KvSequence(request.cache_salt, block_hashes)
        self.engine_state: object | None = None
        self.arrived = time.monotonic()        # arrival, first admission, prompt done: for tracing
        self.admitted: float | None = None
        self.prefilled: float | None = None
        self.order = 0                          # admission order, for preemption

    # -- scheduler side -------------------------------------------------------------------------

    @property
    def computed(self) -> int:
        """Tokens whose KV this request holds."""
        return len(self.seq.tokens)

    @property
    def prefilling(self) -> bool:
        """Known tokens are still to be fed (a prompt, a recompute, or a sampled token not yet fed)."""
        return self.computed < len(self.all_tokens)

    def lookahead(self) -> int | None:
        """The token the next sampling step generates, when known in advance (a ``source``); else None."""
        return self.source.peek() if self.source is not None else None

    def mark_admitted(self, cached_tokens: int) -> None:
        self.order = next(_admission_counter)
        if self.cached_tokens is None:
            self.cached_tokens = cached_tokens
            self.admitted = time.monotonic()

    def lose_blocks(self) -> None:
        """Preempted or released: the blocks are gone, so is the compute's state built on them."""
        self.engine_state = None

    def prompt_done(self) -> None:
        if self._queue_prompt_info():
            self.prefilled = time.monotonic()

    def deliver(self, token: int) -> None:
        """A token was generated this step: apply stop rules and queue what may be emitted."""
        self.prompt_done()
        if self._accept(token):
            if self.source is not None:
                self.source.pop()
            self.all_tokens.append(token)

    # -- consumer side --------------------------------------------------------------------------

    def _prompt_info(self) -> PromptInfo:
        admitted = self.admitted if self.admitted is not None else self.arrived
        return PromptInfo(self.prompt_len, self.cached_tokens or 0, queue_seconds=admitted - self.arrived,
                          prefill_seconds=(self.prefilled or admitted) - admitted)

