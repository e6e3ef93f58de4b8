"""A chat resumed on this replica after the parse replica serving it went away mid-stream.

The gateway sends the chat again with a ``Continuation``: the generated token ids its first stream
delivered, router frame by router frame, the ids of the tool calls already started and the first
stream's prompt counts. The resumed stream renders the prompt as usual, then asks the router for the
rest as a router migration asks a worker (:meth:`Continued.router_request`: the prompt plus those ids,
``continued_tokens`` set, ``max_tokens`` less those ids), replays the ids silently through a fresh output
pipeline (``OutputPipeline.replay``: the same frames give the same parser state and call ids) and emits
only what comes after: no second ``Started``, and a final usage counting every token once
(:meth:`Continued.whole_usage`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from services.api import chat_pb2, common_pb2, worker_pb2
from services.common import token_bytes
from services.common.errors import InvalidRequestError


@dataclass(frozen=True)
class Continued:
    """What the first stream of a resumed chat delivered (from ``ChatRequest.continuation``)."""

    token_ids: tuple[int, ...]
    frames: tuple[tuple[int, ...], ...]  # ``token_ids`` as the router frames that carried them
    call_ids: tuple[str, ...]
    prompt_tokens: int
    cached_tokens: int
    resumes: int = 1

    @classmethod
    def from_proto(cls, cont: chat_pb2.Continuation) -> Continued:
        if len(cont.token_ids_u32) % 4:
            raise InvalidRequestError("continuation token ids are not packed u32", param="continuation")
        ids = tuple(token_bytes.unpack(cont.token_ids_u32))
        if sum(cont.frame_sizes) != len(ids):
            raise InvalidRequestError("continuation frame sizes do not add up to its token ids",
                                      param="continuation")
        frames, at = [], 0
        for size in cont.frame_sizes:
            frames.append(ids[at:at + size])
            at += size
        return cls(ids, tuple(frames), tuple(cont.tool_call_ids), cont.prompt_tokens, cont.cached_tokens,
                   max(cont.resumes, 1))

    def router_request(self, first: worker_pb2.GenerateRequest, prompt: bytes
                       ) -> tuple[worker_pb2.GenerateRequest, bytes] | None:
        """The router's request for the rest of ``first`` (the request a clean run sends, with its prompt
        ``prompt``, packed ids) and the rest's prompt; None when the first stream already had every token
        ``max_tokens`` allows."""
        done = len(self.token_ids)
        limit = first.sampling.max_tokens
        if limit and done >= limit:
            return None
        out = worker_pb2.GenerateRequest()
        out.CopyFrom(first)
        out.request_id = f"{first.request_id}.resumed{self.resumes}"
        out.ClearField("token_ids_u32")
        out.continued_tokens = first.continued_tokens + done
        if limit:
            out.sampling.max_tokens = limit - done
        if out.hints.osl:
            out.hints.osl = max(out.hints.osl - done, 0)
        return out, prompt + token_bytes.pack(self.token_ids)

    def whole_usage(self, usage: common_pb2.Usage) -> None:
        """The router's usage of the rest, made the whole turn's: the first stream's prompt counts, and the
        continued tokens (the router counted them as prompt) as completion."""
        usage.prompt_tokens = self.prompt_tokens
        usage.cached_tokens = self.cached_tokens
        usage.completion_tokens += len(self.token_ids)

    def finished_stream(self) -> FinishedStream:
        """The router stream of a continuation with nothing left to generate: one final ``length`` frame."""
        return FinishedStream(worker_pb2.GenerateResponse(
            finish_reason=common_pb2.FINISH_REASON_LENGTH, usage=common_pb2.Usage(completion_tokens=0)))


class FinishedStream:
    """A router stream of one frame, read like ``ResumingRouterStream``."""

    def __init__(self, frame: worker_pb2.GenerateResponse) -> None:
        self._frame = frame

    def cancel(self) -> None:
        pass

    async def __aiter__(self) -> AsyncIterator[worker_pb2.GenerateResponse]:
        yield self._frame
