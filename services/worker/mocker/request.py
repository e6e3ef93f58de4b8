"""Per-request state of the mocker: what was generated, what the consumer has not read yet."""

from __future__ import annotations

import asyncio
import itertools
import time

from services.common.errors import MeshError
from services.worker.engine import EngineOutput, EngineRequest, FinishReason, PromptInfo, Usage
from services.worker.mocker.block_manager import KvSequence
from services.worker.mocker.script import TokenSource
from services.worker.mocker.stops import StopStringMatcher

_admission_counter = itertools.count()


class MockRequest:
    """A request inside the mocker: its KV sequence, token source, stop rules and output buffer."""

    def __init__(
        self,
        request: EngineRequest,
        *,
        max_tokens: int,
        stop_ids: frozenset[int],
        source: TokenSource,
        matcher: StopStringMatcher,
    ) -> None:
        self.request = request
        self.request_id = request.request_id
        self.prompt_len = len(request.token_ids)
        self.all_tokens: list[int] = list(request.token_ids)  # prompt + generated (recomputed on preemption)
        self.max_tokens = max_tokens
        self.stop_ids = stop_ids
        self.source = source
        self.matcher = matcher
        self.seq = KvSequence(request.cache_salt)
        self.generated = 0
        self.cached_tokens: int | None = None  # set on first admission
        self.arrived = time.monotonic()        # arrival, first admission, prompt done: for tracing
        self.admitted: float | None = None
        self.prefilled: float | None = None
        self.order = 0                          # admission order, for preemption
        # consumer side
        self.ready = asyncio.Event()
        self._out: list[int] = []
        self._prompt_pending = False
        self._prompt_sent = False
        self.finish_reason: FinishReason | None = None
        self.error: MeshError | None = None
        self._final_sent = False

    # -- scheduler side -------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.error is not None

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
        if not self._prompt_sent and not self._prompt_pending:
            self._prompt_pending = True
            self.prefilled = time.monotonic()
            self.ready.set()

    def deliver(self, token: int) -> None:
        """A token was generated this step: apply stop rules and queue what may be emitted."""
        self.prompt_done()
        if token in self.stop_ids:
            self._out.extend(self.matcher.flush())
            self.finish("stop")
            return
        self.source.pop()
        self.generated += 1
        self.all_tokens.append(token)
        self._out.extend(self.matcher.push(token))
        if self.matcher.stop_string:
            self.finish("stop")
        elif self.generated >= self.max_tokens:
            self._out.extend(self.matcher.flush())
            self.finish("length")
        self.ready.set()

    def finish(self, reason: FinishReason) -> None:
        if not self.finished:
            self.finish_reason = reason
        self.ready.set()

    def fail(self, error: MeshError) -> None:
        if not self.finished:
            self.error = error
        self.ready.set()

    # -- consumer side --------------------------------------------------------------------------

    def take_output(self) -> EngineOutput | None:
        """Everything queued since the last call as one output (None when there is nothing new)."""
        if self._final_sent:
            return None
        tokens, self._out = tuple(self._out), []
        prompt = None
        if self._prompt_pending:
            self._prompt_pending, self._prompt_sent = False, True
            admitted = self.admitted if self.admitted is not None else self.arrived
            prompt = PromptInfo(self.prompt_len, self.cached_tokens or 0, queue_seconds=admitted - self.arrived,
                                prefill_seconds=(self.prefilled or admitted) - admitted)
        if self.finish_reason is None:
            if not tokens and prompt is None:
                return None
            return EngineOutput(tokens, prompt)
        self._final_sent = True
        usage = Usage(self.prompt_len, self.generated, self.cached_tokens or 0)
        return EngineOutput(tokens, prompt, self.finish_reason, usage, self.matcher.stop_string)
