"""Request validation and the consumer side of a request, shared by every engine.

:class:`OutputBuffer` is the one implementation of the output contract (see the worker README's
invariants); the core's :class:`~services.kvcore.request.CoreRequest` and, for engines that schedule
themselves (TensorRT-LLM), :class:`RequestStream` build on it: the first output carries ``PromptInfo``,
the last one ``finish_reason`` and ``usage``; each output holds every token produced since the
consumer's previous read; EOS / stop token ids end the request with ``stop`` and are not emitted; a
matched stop string is not emitted (``stops.py`` holds back tokens that may start one); a request
that ends for another reason (``length``, ``stop`` from the engine) releases the held tokens, a
cancelled one drops them.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tokenizers import Tokenizer

from services.common.errors import ContextLengthError, InternalError, InvalidRequestError, MeshError
from services.common.model_dir import ModelDir
from services.kvcore.domain import EngineOutput, EngineRequest, FinishReason, PromptInfo, Usage
from services.kvcore.stops import StopStringMatcher

if TYPE_CHECKING:  # asyncio loads with the first consumer that waits: the offline replay has none
    import asyncio


@dataclass(frozen=True)
class CheckedRequest:
    """A validated request: its id filled in, ``max_tokens`` clamped, the ids that end it."""

    request: EngineRequest
    max_tokens: int
    stop_ids: frozenset[int]


def check_request(
    request: EngineRequest, model: ModelDir, *, capacity_tokens: int, max_tokens_default: int, max_model_len: int = 0
) -> CheckedRequest:
    """Validate ``request`` as every engine does (errors raise before the first output)."""
    if not request.request_id:
        request = replace(request, request_id=f"req-{uuid.uuid4().hex[:12]}")
    prompt_len = len(request.token_ids)
    if prompt_len == 0:
        raise InvalidRequestError("the prompt has no tokens", param="token_ids")
    if request.max_tokens < 0:
        raise InvalidRequestError("max_tokens must not be negative", param="max_tokens")
    max_len = max_model_len or model.max_model_len
    if prompt_len >= max_len:
        raise ContextLengthError(
            f"the prompt has {prompt_len} tokens; this model's context is {max_len} tokens", param="messages")
    if prompt_len + 1 > capacity_tokens:
        raise ContextLengthError(
            f"the prompt has {prompt_len} tokens; this worker's KV cache holds {capacity_tokens - 1}",
            param="messages")
    max_tokens = min(request.max_tokens or max_tokens_default, max_len - prompt_len)
    stop_ids = set(request.stop_token_ids)
    if not request.ignore_eos:
        stop_ids.update(model.eos_token_ids)
    return CheckedRequest(request, max_tokens, frozenset(stop_ids))


class OutputBuffer:
    """Tokens in from an engine, :class:`EngineOutput` batches out to one consumer.

    Subclasses say when the prompt is done and feed tokens through :meth:`_accept`; the consumer
    reads with :meth:`outputs` (or :meth:`take_output`).
    """

    def __init__(
        self, request: EngineRequest, *, max_tokens: int, stop_ids: frozenset[int], matcher: StopStringMatcher
    ) -> None:
        self.request = request
        self.request_id = request.request_id
        self.prompt_len = len(request.token_ids)
        self.max_tokens = max_tokens
        self.stop_ids = stop_ids
        self.matcher = matcher
        self.generated = 0
        self.cached_tokens: int | None = None
        self.finish_reason: FinishReason | None = None
        self.error: MeshError | None = None
        self._waiter: asyncio.Event | None = None  # made by the consumer's first wait in outputs()
        self._out: list[int] = []
        self._prompt_pending = False
        self._prompt_sent = False
        self._final_sent = False

    def _wake(self) -> None:
        if self._waiter is not None:
            self._waiter.set()

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    def _queue_prompt_info(self) -> bool:
        """Queue the prompt info for the next output, once; True if it was queued now."""
        if self._prompt_sent or self._prompt_pending:
            return False
        self._prompt_pending = True
        self._wake()
        return True

    def _accept(self, token: int) -> bool:
        """Apply the stop rules to a generated token; False when it was a stop token id (never emitted)."""
        if token in self.stop_ids:
            self._out.extend(self.matcher.flush())
            self.finish("stop")
            return False
        self.generated += 1
        self._out.extend(self.matcher.push(token))
        if self.matcher.stop_string:
            self.finish("stop")
        elif self.generated >= self.max_tokens:
            self._out.extend(self.matcher.flush())
            self.finish("length")
        self._wake()
        return True

    def _accept_quiet(self, tokens: list[int]) -> None:
        """:meth:`_accept` of each of ``tokens``, known to hit no stop id, no stop string and no ``max_tokens``."""
        if (not self.stop_ids.isdisjoint(tokens) or self.matcher.active
                or self.generated + len(tokens) >= self.max_tokens):
            raise ValueError("these tokens may end the request: accept them one by one")
        self.generated += len(tokens)
        self._out.extend(tokens)
        self._wake()

    def finish(self, reason: FinishReason) -> None:
        """End the request; tokens held back for a possible stop string are released unless cancelled."""
        if not self.finished:
            if reason != "cancelled":
                self._out.extend(self.matcher.flush())
            self.finish_reason = reason
        self._wake()

    def fail(self, error: MeshError) -> None:
        if not self.finished:
            self.error = error
        self._wake()

    def _prompt_info(self) -> PromptInfo:
        return PromptInfo(self.prompt_len, self.cached_tokens or 0)

    def take_output(self) -> EngineOutput | None:
        """Everything queued since the last call as one output (None when there is nothing new)."""
        if self._final_sent:
            return None
        tokens, self._out = tuple(self._out), []
        prompt = None
        if self._prompt_pending:
            self._prompt_pending, self._prompt_sent = False, True
            prompt = self._prompt_info()
        if self.finish_reason is None:
            if not tokens and prompt is None:
                return None
            return EngineOutput(tokens, prompt)
        self._final_sent = True
        usage = Usage(self.prompt_len, self.generated, self.cached_tokens or 0)
        return EngineOutput(tokens, prompt, self.finish_reason, usage, self.matcher.stop_string)

    async def outputs(self) -> AsyncGenerator[EngineOutput, None]:
        """Wait for and yield outputs until the final one (raises the request's error, if any)."""
        while True:
            out = self.take_output()
            if out is not None:
                yield out
                if out.finish_reason is not None:
                    return
                continue
            if self.error is not None:
                raise self.error
            if self._final_sent:
                raise InternalError("the request's stream already ended")
            if self._waiter is None:
                import asyncio

                self._waiter = asyncio.Event()
            self._waiter.clear()
            await self._waiter.wait()


class RequestStream(OutputBuffer):
    """A request of an engine that schedules itself: tokens in (``deliver``), outputs out (``outputs``)."""

    def __init__(self, checked: CheckedRequest, tokenizer: Tokenizer) -> None:
        super().__init__(checked.request, max_tokens=checked.max_tokens, stop_ids=checked.stop_ids,
                         matcher=StopStringMatcher(tokenizer, checked.request.stop))

    def prompt_done(self, cached_tokens: int) -> None:
        """The prompt is prefilled; ``cached_tokens`` of it came from the prefix cache."""
        if self.cached_tokens is None:
            self.cached_tokens = cached_tokens
        self._queue_prompt_info()

    def deliver(self, token: int) -> bool:
        """A generated token: apply stop rules, queue what may be emitted; True when the request ended."""
        if self.finished:
            return True
        if self.cached_tokens is None:
            self.prompt_done(0)
        self._accept(token)
        return self.finished
