"""One Generate stream as the router sees it: domain values, and the stitching of worker attempts.

The client must see one uninterrupted response: the first worker's ``prompt`` frame only, every token
exactly once, and a final ``usage`` that counts the whole generation. After a worker fails mid-stream
the next one gets the prompt plus the tokens generated so far, and ``max_tokens`` minus those tokens.

No protobuf here: ``convert.py`` turns ``GenerateRequest`` / ``GenerateResponse`` into these values and back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from services.common import token_bytes
from services.common.errors import MeshError


@dataclass(frozen=True)
class ProxyRequest:
    """What the router reads from a Generate request (the rest travels to the worker untouched)."""

    request_id: str
    tokens: bytes                   # the prompt's token ids, packed (``services.common.token_bytes``)
    max_tokens: int = 0             # 0: the worker's default
    osl: int = 0                    # expected output length (agent hint; 0: unknown)
    priority: int = 0               # admission order while every worker is saturated
    cache_salt: str = ""
    target_worker_id: str = ""      # run there if it is live (first attempt only)
    prefill_only: bool = False      # compute the prompt's KV, stream no tokens


@dataclass(frozen=True)
class AttemptRequest:
    """What one worker attempt runs: the prompt plus the tokens so far, and what is left of the limits.

    The attempt never carries ``target_worker_id`` or ``prefill_only`` (a prefill-only request runs as
    one token).
    """

    tokens: bytes                   # packed token ids (``services.common.token_bytes``)
    max_tokens: int
    osl: int


@dataclass(frozen=True)
class PromptInfo:
    prompt_tokens: int
    cached_tokens: int = 0
    worker_id: str = ""


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(frozen=True)
class Frame:
    """One frame of a generate stream, from a worker or to the client."""

    token_ids: tuple[int, ...] = ()
    prompt: PromptInfo | None = None     # first frame only
    finish_reason: str = ""              # last frame only: "stop", "length", ... ("": not the last frame)
    usage: Usage | None = None           # last frame only
    error: MeshError | None = None       # in-band error; the stream ends after it
    stop_string: str = ""
    # A plain token frame as the worker sent it (opaque here): the adapter passes it on as it came
    # instead of building the same message again. None once the router changed anything.
    wire: object = field(default=None, compare=False, repr=False)

    @property
    def final(self) -> bool:
        """The worker says nothing after this frame."""
        return bool(self.finish_reason) or self.error is not None


class StreamProgress:
    """Tokens delivered so far and the bookkeeping to stitch worker attempts into one stream."""

    def __init__(self, request: ProxyRequest) -> None:
        self.request = request
        self.prompt_len = token_bytes.count(request.tokens)
        self.generated: list[int] = []
        self.sent_any = False
        self._prompt_sent = False
        self._cached_tokens = 0
        self._attempt_base = 0
        self.prefill_only = request.prefill_only

    @property
    def remaining(self) -> int | None:
        """Tokens still allowed (None: the worker's default applies)."""
        limit = self.request.max_tokens
        return None if limit <= 0 else max(limit - len(self.generated), 0)

    def tokens_so_far(self) -> bytes:
        """The prompt plus every token generated so far, packed: what the next attempt prefills."""
        if not self.generated:
            return self.request.tokens
        return self.request.tokens + token_bytes.pack(self.generated)

    def next_attempt(self) -> AttemptRequest:
        """The request for the next attempt: prompt plus everything generated so far."""
        self._attempt_base = len(self.generated)
        request = self.request
        tokens, max_tokens, osl = self.tokens_so_far(), request.max_tokens, request.osl
        if self.generated:
            max_tokens = self.remaining or 0
            if osl:
                osl = max(osl - len(self.generated), 0)
        if self.prefill_only:
            max_tokens = 1
        return AttemptRequest(tokens, max_tokens, osl)

    def absorb(self, frame: Frame, worker_id: str) -> Frame | None:
        """The frame to pass on to the client for one worker frame (None: nothing to say)."""
        out = frame
        if frame.prompt is not None:
            if self._prompt_sent:
                out = dataclasses.replace(out, prompt=None)
            else:
                self._prompt_sent = True
                self._cached_tokens = frame.prompt.cached_tokens
                out = dataclasses.replace(out, prompt=dataclasses.replace(
                    frame.prompt, prompt_tokens=self.prompt_len, worker_id=frame.prompt.worker_id or worker_id))
        if self.prefill_only:
            out = dataclasses.replace(out, token_ids=(), wire=None)
        else:
            self.generated.extend(frame.token_ids)
        if frame.usage is not None:
            completion = 0 if self.prefill_only else self._attempt_base + frame.usage.completion_tokens
            out = dataclasses.replace(out, usage=dataclasses.replace(
                frame.usage, prompt_tokens=self.prompt_len, cached_tokens=self._cached_tokens,
                completion_tokens=completion))
        if not (out.token_ids or out.prompt is not None or out.finish_reason or out.error is not None):
            return None
        self.sent_any = True
        return out

    def finished_early(self) -> Frame | None:
        """A final frame when a failed worker had already produced every allowed token."""
        if self.remaining != 0:
            return None
        return Frame(finish_reason="length", usage=Usage(
            prompt_tokens=self.prompt_len, completion_tokens=len(self.generated), cached_tokens=self._cached_tokens))
