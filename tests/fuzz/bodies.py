"""Valid seed requests of each HTTP API, and the hostile values the fuzzer puts into them.

A seed is a plain JSON-able dict; :class:`Raw` marks bytes written into the body verbatim (tokens no
JSON encoder writes: ``1e400``, deep nesting, invalid UTF-8 inside a string).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Raw:
    """Bytes spliced into the serialized body in place of this value (``inside_string``: within quotes)."""

    data: bytes
    inside_string: bool = False


WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city"],
}

# (path, api) of every fuzzed endpoint; ``api`` picks the seed and the error shape.
ENDPOINTS = (
    ("/v1/chat/completions", "chat"),
    ("/v1/messages", "messages"),
    ("/v1/messages/count_tokens", "count_tokens"),
    ("/v1/responses", "responses"),
    ("/tokenize", "tokenize"),
    ("/detokenize", "detokenize"),
)
STREAMING_APIS = frozenset({"chat", "messages", "responses"})


def _chat_messages(rng: random.Random) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.6:
        messages.append({"role": rng.choice(["system", "developer"]), "content": "You are terse."})
    messages.append({"role": "user", "content": "What is the weather in Paris?"})
    if rng.random() < 0.5:
        messages += [
            {"role": "assistant", "content": None, "reasoning_content": "I should call the tool.",
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "22 degrees"},
            {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
        ]
    return messages


def chat_seed(rng: random.Random) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "demo", "max_tokens": rng.choice([1, 2, 4, 8]), "messages": _chat_messages(rng)}
    if rng.random() < 0.5:
        body["tools"] = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                                            "parameters": WEATHER_SCHEMA}}]
        body["tool_choice"] = rng.choice(["auto", "none", "required",
                                          {"type": "function", "function": {"name": "get_weather"}}])
    optional = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "seed": 7, "stop": ["\n\n"], "ignore_eos": False,
                "chat_template_kwargs": {"enable_thinking": False}, "max_completion_tokens": 4,
                "nvext": {"agent_hints": {"priority": 1, "osl": 16}, "agent_context": {"session_id": "s-1"}}}
    body.update({k: v for k, v in optional.items() if rng.random() < 0.2})
    return body


def _anthropic_messages(rng: random.Random) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris?"}]
    if rng.random() < 0.5:
        messages += [
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Call the tool.", "signature": ""},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "22"}]},
                {"type": "text", "text": "thanks"}]},
        ]
    return messages


def count_tokens_seed(rng: random.Random) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "demo", "messages": _anthropic_messages(rng)}
    if rng.random() < 0.5:
        body["system"] = rng.choice(["Be terse.", [{"type": "text", "text": "Be terse."}]])
    if rng.random() < 0.5:
        body["tools"] = [{"name": "get_weather", "description": "Weather.", "input_schema": WEATHER_SCHEMA}]
        body["tool_choice"] = rng.choice([{"type": "auto"}, {"type": "any"}, {"type": "tool", "name": "get_weather"}])
    optional = {"thinking": {"type": "enabled", "budget_tokens": 256}, "metadata": {"user_id": "u-1"},
                "output_config": {"effort": "low"},
                "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}}
    body.update({k: v for k, v in optional.items() if rng.random() < 0.2})
    return body


def messages_seed(rng: random.Random) -> dict[str, Any]:
    body = count_tokens_seed(rng)
    body["max_tokens"] = rng.choice([1, 2, 4, 8])
    optional = {"temperature": 0.5, "top_p": 0.9, "top_k": 10, "stop_sequences": ["END"]}
    body.update({k: v for k, v in optional.items() if rng.random() < 0.2})
    return body


def responses_seed(rng: random.Random) -> dict[str, Any]:
    items: list[dict[str, Any]] | str
    if rng.random() < 0.3:
        items = "What is the weather in Paris?"
    else:
        items = [{"role": "user", "content": "What is the weather in Paris?"}]
        if rng.random() < 0.5:
            items += [
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Call the tool."}]},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "22"},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
            ]
    body: dict[str, Any] = {"model": "demo", "max_output_tokens": rng.choice([1, 2, 4, 8]), "input": items,
                            "store": False}
    if rng.random() < 0.5:
        body["tools"] = [{"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA},
                         {"type": "custom", "name": "apply_patch", "format": {"type": "text"}}]
        body["tool_choice"] = rng.choice(["auto", "required", {"type": "function", "name": "get_weather"}])
    optional = {"instructions": "Be terse.", "reasoning": {"effort": "low", "summary": "auto"},
                "text": {"format": {"type": "text"}}, "temperature": 0.5, "top_p": 0.9,
                "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k-1", "metadata": {"a": "b"}}
    body.update({k: v for k, v in optional.items() if rng.random() < 0.2})
    return body


def tokenize_seed(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.3:
        return {"model": "demo", "prompt": "hello there", "add_special_tokens": rng.random() < 0.5}
    body: dict[str, Any] = {"model": "demo", "messages": _chat_messages(rng)}
    if rng.random() < 0.3:
        body["tools"] = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA}}]
    return body


def detokenize_seed(rng: random.Random) -> dict[str, Any]:
    return {"model": "demo", "tokens": [rng.randrange(0, 500) for _ in range(rng.randrange(0, 8))]}


SEEDS = {"chat": chat_seed, "messages": messages_seed, "count_tokens": count_tokens_seed,
         "responses": responses_seed, "tokenize": tokenize_seed, "detokenize": detokenize_seed}


# -- hostile values ---------------------------------------------------------------------------------

_ODD_TEXT = [
    "", " ", "\x00", "\x00\x01\x1f", "\ud800", "\udfff", "a\ud83db", "\ufeff", "\ufffe\uffff", "\U0010ffff",
    "🙂" * 64, "\u202e\u200b\u200d", "<|im_start|>system\n", "<tool_call>{", "</think>", "{{ raise('x') }}",
    "{% for %}", "\\", '"', "null", "NaN", "9" * 400, "a" * 5000, "\r\n\r\n", "%s%n", "../../etc/passwd",
]
_NUMBERS: list[Any] = [
    0, -1, 1, 2, 255, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 2**64 + 1, -(2**31),
    -(2**63), -(2**63) - 1, 10**30, -(10**30), 10**400, 0.5, -0.0, 1.5, 2.0000001, 1e308, -1e308, 5e-324,
    float("nan"), float("inf"), float("-inf"), Raw(b"1e400"), Raw(b"-1e400"), Raw(b"1E-400"), Raw(b"-0"),
]


def odd_string(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.5:
        return rng.choice(_ODD_TEXT)
    if roll < 0.7:  # random code points, surrogates included
        return "".join(chr(rng.choice([rng.randrange(0, 0x80), rng.randrange(0xD800, 0xE000),
                                       rng.randrange(0x80, 0x110000)])) for _ in range(rng.randrange(1, 40)))
    if roll < 0.9:  # invalid UTF-8 inside a string
        return Raw(rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80x"]),
                   inside_string=True)
    return rng.choice(["x" * rng.randrange(10_000, 200_000), "é" * 50_000])


def deep(rng: random.Random) -> Raw:
    depth = rng.choice([64, 200, 1000, 1100, 5000, 50_000])
    if rng.random() < 0.5:
        return Raw(b"[" * depth + b"]" * depth)
    return Raw(b'{"a":' * depth + b"1" + b"}" * depth)


def hostile(rng: random.Random) -> Any:
    """One value of a wrong or extreme kind."""
    roll = rng.random()
    if roll < 0.3:
        return rng.choice(_NUMBERS)
    if roll < 0.6:
        return odd_string(rng)
    if roll < 0.7:
        return deep(rng)
    return rng.choice([None, True, False, [], {}, [None], [1, "a"], {"": None}, {"type": None}, [[[]]],
                       {"role": "user"}, [{"type": "text"}], {"\ud800": 1}])
