"""Seeded fuzz cases of the gRPC edge (``AgentService.Chat``): odd but well-typed requests, and raw bytes
that are not a ``ChatRequest`` at all (sent with an identity serializer).

Acceptable outcomes: OK (a stream ending in finish, or an in-band error that is not INTERNAL), or a
client-error status. UNKNOWN, INTERNAL, UNAVAILABLE, DATA_LOSS and UNIMPLEMENTED are findings.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import grpc

from services.api import chat_pb2

CLIENT_STATUSES = frozenset({
    grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAUTHENTICATED,
})

_TEXTS = ["", "hi", "\x00", "🙂" * 100, "<|im_end|>", "</think>", "<tool_call>{", "{{ x }}", "a" * 100_000,
          "\u202e", "\U0010ffff"]
_JSON = ["", "{}", "null", "[]", "5", '"s"', "{", "{bad", "NaN", '{"a": NaN}', "[" * 2000 + "]" * 2000,
         '{"type": "object", "properties": 5}', '{"enable_thinking": "yes"}', '{"tools": 1}', "1e400",
         '{"reasoning_effort": {"x": 1}}', '{"messages": []}', '{"add_generation_prompt": 3}']


@dataclass(frozen=True)
class GrpcCase:
    """One ``AgentService`` call: a request, or raw bytes in its place; call metadata."""

    index: int
    request: chat_pb2.ChatRequest | None
    raw: bytes = b""
    metadata: tuple[tuple[str, str], ...] = ()
    mutations: tuple[str, ...] = ()


def valid_request(rng: random.Random) -> chat_pb2.ChatRequest:
    request = chat_pb2.ChatRequest(model="demo", messages=[
        chat_pb2.Message(role="user", parts=[chat_pb2.Part(text="What is the weather in Paris?")])])
    request.sampling.max_tokens = rng.choice([1, 2, 4])
    if rng.random() < 0.4:
        request.tools.append(chat_pb2.Tool(name="get_weather", description="Weather.",
                                           parameters_json='{"type": "object", "properties": {}}'))
    return request


def _message(rng: random.Random) -> chat_pb2.Message:
    message = chat_pb2.Message(role=rng.choice(["user", "assistant", "tool", "system", "developer", "", "bot",
                                                "USER", "function", "\x00"]))
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        kind = rng.choice(["text", "reasoning", "tool_call", "empty"])
        if kind == "text":
            message.parts.append(chat_pb2.Part(text=rng.choice(_TEXTS)))
        elif kind == "reasoning":
            message.parts.append(chat_pb2.Part(reasoning=rng.choice(_TEXTS)))
        elif kind == "tool_call":
            message.parts.append(chat_pb2.Part(tool_call=chat_pb2.ToolCall(
                id=rng.choice(["", "c1", "x" * 300]), name=rng.choice(["", "get_weather", "<tool_call>"]),
                arguments_json=rng.choice(_JSON))))
        else:
            message.parts.append(chat_pb2.Part())
    message.tool_call_id = rng.choice(["", "", "c1", "\x00"])
    message.is_error = rng.random() < 0.2
    return message


def mutate(request: chat_pb2.ChatRequest, rng: random.Random) -> str:
    kind = rng.choice(["messages", "empty", "tools", "choice", "kwargs", "sampling", "hints", "model", "flags",
                       "identity", "many"])
    if kind == "messages":
        request.messages.extend(_message(rng) for _ in range(rng.randrange(1, 4)))
    elif kind == "empty":
        del request.messages[:]
    elif kind == "tools":
        request.tools.append(chat_pb2.Tool(name=rng.choice(["", "t", "get_weather", "a" * 5000, "\x00"]),
                                           parameters_json=rng.choice(_JSON)))
    elif kind == "choice":
        request.tool_choice.mode = rng.choice(["", "auto", "none", "required", "named", "any", "bogus"])
        request.tool_choice.name = rng.choice(["", "get_weather", "missing"])
    elif kind == "kwargs":
        request.chat_template_kwargs_json = rng.choice(_JSON)
    elif kind == "sampling":
        s = request.sampling
        field = rng.choice(["max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "ignore_eos"])
        if field == "max_tokens":
            s.max_tokens = rng.choice([-1, -(2**31), 2**31 - 1, 0])
        elif field in ("temperature", "top_p"):
            setattr(s, field, rng.choice([float("nan"), float("inf"), -float("inf"), -1.0, 0.0, 5.0, 3e38]))
        elif field == "top_k":
            s.top_k = rng.choice([-2, -1, 0, 2**31 - 1, -(2**31)])
        elif field == "seed":
            s.seed = rng.choice([-(2**63), 2**63 - 1, -1])
        elif field == "stop":
            s.stop.extend(rng.choice([[""], ["a"] * 1000, ["\x00"], ["x" * 10_000]]))
        else:
            s.ignore_eos = True
    elif kind == "hints":
        request.hints.priority = rng.choice([-(2**31), 2**31 - 1, -1])
        request.hints.osl = rng.choice([-(2**31), 2**31 - 1, -1])
        request.hints.speculative_prefill = rng.random() < 0.5
    elif kind == "model":
        request.model = rng.choice(["", "nope", "demo\x00", "x" * 5000, "🙂"])
    elif kind == "flags":
        request.continue_final_message = rng.random() < 0.7
        request.add_generation_prompt = rng.random() < 0.5
        request.strip_billing_header = rng.random() < 0.5
    elif kind == "identity":
        request.identity.session_id = rng.choice(["", "x" * 10_000, "\x00", "🙂"])
        request.identity.anonymous = rng.random() < 0.5
        request.request_id = rng.choice(["", "\x00", "r" * 5000])
    else:
        request.messages.extend(chat_pb2.Message(role="user", parts=[chat_pb2.Part(text="hi")])
                                for _ in range(rng.choice([100, 2000])))
    return kind


def _raw(rng: random.Random, valid: bytes) -> tuple[bytes, str]:
    kind = rng.choice(["garbage", "truncated", "bad utf8", "wrong wire type", "unknown field", "huge length"])
    if kind == "garbage":
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))), kind
    if kind == "truncated":
        return valid[: rng.randrange(1, max(2, len(valid)))], kind
    if kind == "bad utf8":  # field 2 (model), a string of invalid UTF-8
        return valid + b"\x12\x03\xff\xfe\xfd", kind
    if kind == "wrong wire type":  # field 3 (messages) as a varint
        return valid + b"\x18\x05", kind
    if kind == "unknown field":
        return valid + b"\xf8\x07\x01", kind
    return valid + b"\x1a\xff\xff\xff\xff\x0f", kind


def grpc_cases(seed: int, n: int, api_key: str = "", start: int = 0) -> list[GrpcCase]:
    rng = random.Random(seed ^ 0x6772_7063)
    metadata: tuple[tuple[str, str], ...] = (("x-api-key", api_key),) if api_key else ()
    out = []
    for index in range(start, start + n):
        request = valid_request(rng)
        roll = rng.random()
        if roll < 0.08:
            out.append(GrpcCase(index, request, metadata=metadata))
            continue
        if roll < 0.2:
            raw, kind = _raw(rng, request.SerializeToString())
            out.append(GrpcCase(index, None, raw, metadata, (f"raw {kind}",)))
            continue
        done = tuple(mutate(request, rng) for _ in range(rng.choice([1, 1, 2, 3])))
        meta = metadata
        if rng.random() < 0.1:
            meta = (*metadata, rng.choice([("x-harnessmesh-priority", "abc"), ("x-session-id", "s" * 3000),
                                           ("x-harnessmesh-osl", str(2**40)), ("user-agent", "")]))
        out.append(GrpcCase(index, request, metadata=meta, mutations=done))
    return out



__all__ = ["CLIENT_STATUSES", "GrpcCase", "grpc_cases"]
