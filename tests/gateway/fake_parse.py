"""A scripted in-process Parse servicer on a real grpc.aio server, and event builders."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from services.api import chat_pb2, common_pb2, parse_pb2, parse_pb2_grpc
from services.common import mux

Responder = Callable[[chat_pb2.ChatRequest], list[chat_pb2.ChatEventBatch]]


def started(prompt_tokens: int = 7, cached: int = 0) -> chat_pb2.ChatEvent:
    return chat_pb2.ChatEvent(
        started=chat_pb2.Started(request_id="r", model="demo", prompt_tokens=prompt_tokens, cached_tokens=cached)
    )


def reasoning(text: str) -> chat_pb2.ChatEvent:
    return chat_pb2.ChatEvent(reasoning_delta=chat_pb2.ReasoningDelta(text=text))


def text(value: str) -> chat_pb2.ChatEvent:
    return chat_pb2.ChatEvent(text_delta=chat_pb2.TextDelta(text=value))


def call_start(index: int, call_id: str, name: str) -> chat_pb2.ChatEvent:
    return chat_pb2.ChatEvent(tool_call_start=chat_pb2.ToolCallStart(index=index, id=call_id, name=name))


def call_args(index: int, delta: str, call_id: str = "") -> chat_pb2.ChatEvent:
    return chat_pb2.ChatEvent(
        tool_call_arguments_delta=chat_pb2.ToolCallArgumentsDelta(index=index, id=call_id, delta=delta)
    )


def dispatch(index: int, call_id: str, name: str, args: str) -> chat_pb2.ChatEvent:
    call = chat_pb2.ToolCall(id=call_id, name=name, arguments_json=args)
    return chat_pb2.ChatEvent(tool_call_dispatch=chat_pb2.ToolCallDispatch(index=index, call=call))


def usage(prompt: int, completion: int, cached: int = 0, reasoning_tokens: int = 0) -> chat_pb2.ChatEvent:
    return chat_pb2.ChatEvent(
        usage=common_pb2.Usage(
            prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached,
            reasoning_tokens=reasoning_tokens,
        )
    )


def finish(reason: int = common_pb2.FINISH_REASON_STOP) -> chat_pb2.ChatEvent:
    return chat_pb2.ChatEvent(finish=chat_pb2.Finish(reason=reason))  # type: ignore[arg-type]


def error(code: int, message: str) -> chat_pb2.ChatEvent:
    return chat_pb2.ChatEvent(error=common_pb2.Error(code=code, message=message))  # type: ignore[arg-type]


def batch(*events: chat_pb2.ChatEvent) -> chat_pb2.ChatEventBatch:
    return chat_pb2.ChatEventBatch(events=list(events))


class FakeParse(parse_pb2_grpc.ParseServicer):
    """Replays ``script`` (or ``responder(request)``) for every Chat; records what it saw."""

    def __init__(self) -> None:
        self.script: list[chat_pb2.ChatEventBatch] = [batch(started(), text("hi"), finish(), usage(7, 1))]
        self.readiness = parse_pb2.ReadyResponse(ready=True, workers=1)
        self.responder: Responder | None = None
        self.hang = False
        self.abort: tuple[grpc.StatusCode, str] | None = None
        self.requests: list[chat_pb2.ChatRequest] = []
        self.tokenize_requests: list[parse_pb2.TokenizeRequest] = []
        self.detokenize_requests: list[parse_pb2.DetokenizeRequest] = []
        self.chat_started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.model = chat_pb2.ModelInfo(served_model_name="demo", max_model_len=4096, created=1700000000)
        self.get_model_calls = 0
        self.model_gate: asyncio.Event | None = None  # set: GetModel answers only once it is set
        self.model_error: grpc.StatusCode | None = None  # set: GetModel fails with it

    async def Chat(self, request: chat_pb2.ChatRequest, context: Any) -> AsyncIterator[chat_pb2.ChatEventBatch]:
        self.requests.append(request)
        self.chat_started.set()
        if self.abort is not None:
            await context.abort(*self.abort)
        frames = self.responder(request) if self.responder is not None else self.script
        try:
            for frame in frames:
                yield frame
            if self.hang:
                await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def Tokenize(self, request: parse_pb2.TokenizeRequest, context: Any) -> parse_pb2.TokenizeResponse:
        self.tokenize_requests.append(request)
        return parse_pb2.TokenizeResponse(token_ids=[1, 2, 3], max_model_len=4096, rendered="x")

    async def Detokenize(
        self, request: parse_pb2.DetokenizeRequest, context: Any
    ) -> parse_pb2.DetokenizeResponse:
        self.detokenize_requests.append(request)
        return parse_pb2.DetokenizeResponse(text="hello")

    async def GetModel(self, request: chat_pb2.ModelInfoRequest, context: Any) -> chat_pb2.ModelInfo:
        self.get_model_calls += 1
        if self.model_error is not None:
            await context.abort(self.model_error, "GetModel fails")
        if self.model_gate is not None:
            await self.model_gate.wait()
        return self.model

    async def Ready(self, request: parse_pb2.ReadyRequest, context: Any) -> parse_pb2.ReadyResponse:
        return self.readiness


async def start_fake_parse(fake: FakeParse) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    parse_pb2_grpc.add_ParseServicer_to_server(fake, server)
    mux.add_mux_server(server, {mux.method_name("Parse", "Chat"): mux.MuxMethod(fake.Chat, chat_pb2.ChatRequest)})
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"
