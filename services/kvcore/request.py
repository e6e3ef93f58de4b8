"""Per-request state of the core: its KV sequence, its tokens, what the consumer has not read yet."""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Iterator, Sequence
from typing import overload

from tokenizers import Tokenizer

from services.kvcore.domain import PromptInfo
from services.kvcore.outputs import CheckedRequest, OutputBuffer
from services.kvcore.retention import RetentionHint, tool_call_ids
from services.kvcore.sequence import KvSequence
from services.kvcore.stops import StopStringMatcher
from services.kvcore.tokens import TokenSource

_admission_counter = itertools.count()


@functools.lru_cache(maxsize=8)
def _tool_call_ids(tokenizer: Tokenizer) -> frozenset[int]:
    return tool_call_ids(tokenizer.token_to_id)


class TokenStream(Sequence[int]):
    """A prompt kept as given (never copied), then the tokens generated after it; slices are lists.

    ``CoreRequest.all_tokens`` when the prompt is shared (``share_prompt``: the simulator's lazily held
    trace prompts); otherwise it is a plain list.
    """

    __slots__ = ("_generated", "_prompt", "_prompt_len")

    def __init__(self, prompt: Sequence[int]) -> None:
        self._prompt = prompt
        self._prompt_len = len(prompt)
        self._generated: list[int] = []

    def __len__(self) -> int:
        return self._prompt_len + len(self._generated)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        n = self._prompt_len
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            if stop <= start:
                return []
            if start >= n:
                return self._generated[start - n : stop - n]
            head = list(self._prompt[start : min(stop, n)])
            if stop > n:
                head.extend(self._generated[: stop - n])
            return head
        i = index + len(self) if index < 0 else index
        if not 0 <= i < len(self):
            raise IndexError("token index out of range")
        return self._prompt[i] if i < n else self._generated[i - n]

    def __iter__(self) -> Iterator[int]:
        yield from self._prompt
        yield from self._generated

    def window(self, start: int, stop: int, then: int | None = None) -> TokenWindow:
        """Tokens ``start:stop`` (then ``then``, if given) as a view: read lazily, never copied whole."""
        return TokenWindow(self, start, stop, () if then is None else (then,))

    def append(self, token: int) -> None:
        self._generated.append(token)

    def extend(self, tokens: Sequence[int]) -> None:
        self._generated.extend(tokens)


class TokenWindow(Sequence[int]):
    """A stretch of a :class:`TokenStream`, then ``extra`` tokens, read lazily: a step's chunk in the simulator
    (the block manager reads its length and, of its tokens, at most a partial block's)."""

    __slots__ = ("_extra", "_start", "_stop", "_stream")

    def __init__(self, stream: TokenStream, start: int, stop: int, extra: tuple[int, ...] = ()) -> None:
        self._stream = stream
        self._start = start
        self._stop = max(start, stop)
        self._extra = extra

    def __len__(self) -> int:
        return self._stop - self._start + len(self._extra)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            if stop <= start:
                return []
            n = self._stop - self._start
            out = self._stream[self._start + start : self._start + min(stop, n)] if start < n else []
            if stop > n:
                out.extend(self._extra[max(start - n, 0) : stop - n])
            return out
        i = index + len(self) if index < 0 else index
        if not 0 <= i < len(self):
            raise IndexError("token index out of range")
        n = self._stop - self._start
        return self._stream[self._start + i] if i < n else self._extra[i - n]

    def __iter__(self) -> Iterator[int]:
        return iter(self[:])


class CoreRequest(OutputBuffer):
    """A request inside an engine core: scheduler state on top of the output buffer.

    ``all_tokens`` is the prompt plus every generated token (recomputed after a preemption): a copy, or with
    ``share_prompt`` a :class:`TokenStream` over the (immutable) prompt itself; the KV
    sequence ``seq`` holds the tokens whose KV blocks are taken. A request with a ``source`` (simulated
    engines) knows each token before the step that generates it; without one the engine's compute
    samples it. ``engine_state`` is the compute's own per-request state (the torch engine's block ids of
    the request's full blocks); the core drops it (``None``) whenever the request loses its blocks.
    """

    def __init__(
        self,
        checked: CheckedRequest,
        *,
        tokenizer: Tokenizer,
        source: TokenSource | None = None,
        block_hashes: list[int] | None = None,
        share_prompt: bool = False,
    ) -> None:
        """``block_hashes``: the prompt's chained block hashes at the engine's block size, when the caller
        has them already (the simulator: the router's placement computed them); the request's KV sequence
        takes the list over and extends it as the request grows."""
        request = checked.request
        super().__init__(request, max_tokens=checked.max_tokens, stop_ids=checked.stop_ids,
                         matcher=StopStringMatcher(tokenizer, request.stop))
        # prompt + generated (recomputed on preemption)
        self.all_tokens: list[int] | TokenStream = (
            TokenStream(request.token_ids) if share_prompt else list(request.token_ids))
        self.source = source
        self.seq = KvSequence(request.cache_salt, block_hashes)
        self.engine_state: object | None = None
        self.arrived = time.monotonic()        # arrival, first admission, prompt done: for tracing
        self.admitted: float | None = None
        self.prefilled: float | None = None
        self.order = 0                          # admission order, for preemption
        # how its blocks are kept once it ends (retention.py): the request's own hint, or the caller's (the replay)
        self.retention: RetentionHint | None = None
        if (request.retention_hold_s > 0 or request.retention_first or request.retention_tool_call_hold_s > 0
                or request.retention_answer_first):
            self.retention = RetentionHint(request.retention_hold_s, request.retention_first,
                                           request.retention_tool_call_hold_s, _tool_call_ids(tokenizer),
                                           answer_first=request.retention_answer_first)

    # -- scheduler side -------------------------------------------------------------------------

    @property
    def computed(self) -> int:
        """Tokens whose KV this request holds."""
        return self.seq.length

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

    def take_known(self, count: int) -> list[int]:
        """The next ``count`` tokens the source generates, consumed (a quiet stretch, ``Scheduler.advance_quiet``)."""
        assert self.source is not None, "only a request that knows its tokens decodes ahead"
        return self.source.take(count)

    def deliver_quiet(self, tokens: list[int]) -> None:
        """:meth:`deliver` of ``tokens`` one by one, for tokens that neither stop nor end the request."""
        self.prompt_done()
        self._accept_quiet(tokens)
        self.all_tokens.extend(tokens)

    # -- consumer side --------------------------------------------------------------------------

    def _prompt_info(self) -> PromptInfo:
        admitted = self.admitted if self.admitted is not None else self.arrived
        return PromptInfo(self.prompt_len, self.cached_tokens or 0, queue_seconds=admitted - self.arrived,
                          prefill_seconds=(self.prefilled or admitted) - admitted)

