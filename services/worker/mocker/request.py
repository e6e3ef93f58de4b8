"""Per-request state of the mocker: what was generated, what the consumer has not read yet."""

from __future__ import annotations

import itertools
import time

from services.worker.engine import EngineRequest, PromptInfo
from services.worker.mocker.block_manager import KvSequence
from services.worker.mocker.script import TokenSource
from services.worker.mocker.stops import StopStringMatcher
from services.worker.outputs import OutputBuffer

_admission_counter = itertools.count()


class MockRequest(OutputBuffer):
    """A request inside the mocker: its KV sequence, token source and stop rules, plus the output buffer."""

    def __init__(
        self,
        request: EngineRequest,
        *,
        max_tokens: int,
        stop_ids: frozenset[int],
        source: TokenSource,
        matcher: StopStringMatcher,
    ) -> None:
        super().__init__(request, max_tokens=max_tokens, stop_ids=stop_ids, matcher=matcher)
        self.all_tokens: list[int] = list(request.token_ids)  # prompt + generated (recomputed on preemption)
        self.source = source
        self.seq = KvSequence(request.cache_salt)
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
        return self.computed < len(self.all_tokens)

    def mark_admitted(self, cached_tokens: int) -> None:
        self.order = next(_admission_counter)
        if self.cached_tokens is None:
            self.cached_tokens = cached_tokens
            self.admitted = time.monotonic()

    def prompt_done(self) -> None:
        if self._queue_prompt_info():
            self.prefilled = time.monotonic()

    def deliver(self, token: int) -> None:
        """A token was generated this step: apply stop rules and queue what may be emitted."""
        self.prompt_done()
        if self._accept(token):
            self.source.pop()
            self.all_tokens.append(token)

    # -- consumer side --------------------------------------------------------------------------

    def _prompt_info(self) -> PromptInfo:
        admitted = self.admitted if self.admitted is not None else self.arrived
        return PromptInfo(self.prompt_len, self.cached_tokens or 0, queue_seconds=admitted - self.arrived,
                          prefill_seconds=(self.prefilled or admitted) - admitted)
