"""One request's router stream as the parse service reads it, continued across a router that goes away.

Before the first frame, :class:`~services.common.prompt_reuse.ReusingCall` opens the stream again
while the router is unavailable (``--router-retry`` seconds). After it, a router that dies or restarts
takes the stream with it; :class:`ResumingRouterStream` then asks the (restarted) router for the rest,
as the router itself migrates a request between workers: the prompt plus every token received so far,
``max_tokens`` minus those tokens. The caller sees one stream: the first prompt frame only, each token
once, and a final usage counting the whole generation against the original prompt.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from services.api import common_pb2, worker_pb2
from services.common import token_bytes
from services.common.prompt_reuse import ReusingCall, ReusingStub

RESUMABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})


class ResumingRouterStream:
    """Iterate the router's frames for ``request`` (see module docstring); :meth:`cancel` leaves it."""

    def __init__(self, router: ReusingStub, request: worker_pb2.GenerateRequest, *, prompt: bytes, key: str,
                 retry: float) -> None:
        """``prompt``: the request's prompt, packed ids (sent beside the message: ``ReusingStub.Generate``)."""
        self._router = router
        self._request = request
        self._prompt = prompt
        self._key = key
        self._retry = retry
        self._call: ReusingCall | None = None
        self._cancelled = False
        self.resumed = 0  # continuations opened after the router went away mid-stream

    def cancel(self) -> None:
        self._cancelled = True
        if self._call is not None:
            self._call.cancel()

    async def __aiter__(self) -> AsyncIterator[worker_pb2.GenerateResponse]:
        loop = asyncio.get_running_loop()
        generated: list[int] = []
        prompt_info: worker_pb2.PromptInfo | None = None
        base = 0  # tokens generated before the current attempt
        request, prompt = self._request, self._prompt
        deadline = loop.time() + self._retry
        while True:
            self._call = call = self._router.Generate(request, prompt=prompt, key=self._key)
            try:
                async for frame in call:
                    if frame.HasField("prompt"):
                        if prompt_info is None:
                            prompt_info = worker_pb2.PromptInfo()
                            prompt_info.CopyFrom(frame.prompt)
                        else:
                            frame.ClearField("prompt")
                    generated.extend(frame.token_ids)
                    if frame.HasField("usage") and base:
                        self._whole_usage(frame.usage, prompt_info, base)
                    yield frame
                return
            except grpc.aio.AioRpcError as exc:
                if (self._cancelled or prompt_info is None or exc.code() not in RESUMABLE
                        or loop.time() > deadline):
                    raise
            base = len(generated)
            continuation = self._continuation(generated)
            if continuation is None:  # the router went away after the last allowed token
                yield self._finished(prompt_info, base)
                return
            request, prompt = continuation
            self.resumed += 1

    def _continuation(self, generated: list[int]) -> tuple[worker_pb2.GenerateRequest, bytes] | None:
        limit = self._request.sampling.max_tokens
        if limit and len(generated) >= limit:
            return None
        out = worker_pb2.GenerateRequest()
        out.CopyFrom(self._request)
        out.ClearField("prompt_base")
        out.ClearField("token_ids_u32")
        out.continued_tokens = self._request.continued_tokens + len(generated)
        if limit:
            out.sampling.max_tokens = limit - len(generated)
        if out.hints.osl:
            out.hints.osl = max(out.hints.osl - len(generated), 0)
        return out, self._prompt + token_bytes.pack(generated)

    def _whole_usage(self, usage: common_pb2.Usage, prompt: worker_pb2.PromptInfo | None, base: int) -> None:
        usage.completion_tokens += base
        if prompt is not None:
            usage.prompt_tokens = prompt.prompt_tokens
            usage.cached_tokens = prompt.cached_tokens

    def _finished(self, prompt: worker_pb2.PromptInfo | None, generated: int) -> worker_pb2.GenerateResponse:
        usage = common_pb2.Usage(completion_tokens=generated)
        if prompt is not None:
            usage.prompt_tokens, usage.cached_tokens = prompt.prompt_tokens, prompt.cached_tokens
        return worker_pb2.GenerateResponse(finish_reason=common_pb2.FINISH_REASON_LENGTH, usage=usage)
