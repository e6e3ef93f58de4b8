"""One client stream as the router sees it across worker attempts (retries and migrations).

The client must see one uninterrupted response: the first worker's ``prompt`` frame only, every token
exactly once, and a final ``usage`` that counts the whole generation. After a worker fails mid-stream
the next one gets the prompt plus the tokens generated so far, and ``max_tokens`` minus those tokens.
"""

from __future__ import annotations

from services.api import common_pb2, worker_pb2


class StreamProgress:
    """Tokens delivered so far and the bookkeeping to stitch worker attempts into one stream."""

    def __init__(self, request: worker_pb2.GenerateRequest) -> None:
        self.request = request
        self.prompt_len = len(request.token_ids)
        self.generated: list[int] = []
        self.sent_any = False
        self._prompt_sent = False
        self._cached_tokens = 0
        self._attempt_base = 0
        self.prefill_only = request.prefill_only

    @property
    def remaining(self) -> int | None:
        """Tokens still allowed (None: the worker's default applies)."""
        limit = self.request.sampling.max_tokens
        return None if limit <= 0 else max(limit - len(self.generated), 0)

    def worker_request(self) -> worker_pb2.GenerateRequest:
        """The request for the next attempt: prompt plus everything generated so far."""
        self._attempt_base = len(self.generated)
        out = worker_pb2.GenerateRequest()
        out.CopyFrom(self.request)
        if self.generated:
            out.token_ids.extend(self.generated)
            out.sampling.max_tokens = self.remaining or 0
            if out.hints.osl:
                out.hints.osl = max(out.hints.osl - len(self.generated), 0)
        if self.prefill_only:
            out.sampling.max_tokens = 1
        out.ClearField("target_worker_id")
        out.prefill_only = False
        return out

    def absorb(self, frame: worker_pb2.GenerateResponse, worker_id: str) -> worker_pb2.GenerateResponse | None:
        """The frame to pass on to the client for one worker frame (None: nothing to say)."""
        out = worker_pb2.GenerateResponse()
        out.CopyFrom(frame)
        if frame.HasField("prompt"):
            if self._prompt_sent:
                out.ClearField("prompt")
            else:
                self._prompt_sent = True
                self._cached_tokens = frame.prompt.cached_tokens
                out.prompt.prompt_tokens = self.prompt_len
                out.prompt.worker_id = out.prompt.worker_id or worker_id
        if self.prefill_only:
            del out.token_ids[:]
        else:
            self.generated.extend(frame.token_ids)
        if frame.HasField("usage"):
            out.usage.prompt_tokens = self.prompt_len
            out.usage.cached_tokens = self._cached_tokens
            completion = 0 if self.prefill_only else self._attempt_base + frame.usage.completion_tokens
            out.usage.completion_tokens = completion
        if not (out.token_ids or out.HasField("prompt") or out.finish_reason or out.HasField("error")):
            return None
        self.sent_any = True
        return out

    def finished_early(self) -> worker_pb2.GenerateResponse | None:
        """A final frame when a failed worker had already produced every allowed token."""
        if self.remaining != 0:
            return None
        return worker_pb2.GenerateResponse(
            finish_reason=common_pb2.FINISH_REASON_LENGTH,
            usage=common_pb2.Usage(prompt_tokens=self.prompt_len, completion_tokens=len(self.generated),
                                   cached_tokens=self._cached_tokens))
