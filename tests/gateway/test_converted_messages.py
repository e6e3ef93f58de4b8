"""A next turn's messages equal to a recent request's are taken from its conversion (``ConvertedMessages``):
whatever the edits, the result is exactly what converting every message afresh gives."""

from __future__ import annotations

import random
from typing import Any

import orjson

from gateway.apis.openai_chat.convert import chat_request
from gateway.apis.openai_chat.models import ChatCompletionRequest
from gateway.converted_messages import MIN_BYTES, ConvertedMessages, message_size
from services.api import chat_pb2


def message(rng: random.Random, i: int) -> dict[str, Any]:
    role = rng.choice(["user", "assistant", "tool", "system"])
    text = " ".join(rng.choice(["alpha", "beta", "gamma", "parse", "tool"]) for _ in range(rng.randrange(1, 400)))
    out: dict[str, Any] = {"role": role, "content": text}
    if role == "tool":
        out["tool_call_id"] = f"call_{i}"
    if role == "assistant" and rng.random() < 0.5:
        out["tool_calls"] = [{"id": f"call_{i}", "type": "function",
                              "function": {"name": "read", "arguments": '{"path": "a.py"}'}}]
    return out


def wire(raw: list[dict[str, Any]], converted: ConvertedMessages[chat_pb2.Message] | None) -> list[bytes]:
    body = orjson.loads(orjson.dumps({"model": "m", "messages": raw}))  # what read_json hands over
    request = chat_request(ChatCompletionRequest.model_validate(body), {}, model="m", request_id="r",
                           raw_messages=body["messages"], converted=converted)
    return [m.SerializeToString() for m in request.messages]


def test_turns_with_random_edits_convert_as_afresh() -> None:
    rng = random.Random(7)
    converted = ConvertedMessages(message_size, max_conversations=4)
    sessions = [[message(rng, i) for i in range(12)] for _ in range(3)]
    for _ in range(120):
        raw = rng.choice(sessions)
        edit = rng.random()
        if edit < 0.6:  # the next turn: a few more messages
            raw.extend(message(rng, len(raw) + k) for k in range(rng.randrange(1, 3)))
        elif edit < 0.8 and len(raw) > 2:  # history rewritten from some point (compaction)
            cut = rng.randrange(1, len(raw))
            raw[cut:] = [message(rng, cut + k) for k in range(rng.randrange(1, 4))]
        elif edit < 0.9:
            raw[0] = message(rng, 0)  # a changed system prompt
        assert wire(raw, converted) == wire(raw, None)
    assert converted.reused > 0


def test_a_next_turn_reuses_every_message_it_repeats() -> None:
    rng = random.Random(1)
    converted = ConvertedMessages(message_size)
    raw = [message(rng, i) for i in range(30)]
    wire(raw, converted)
    before = converted.reused
    wire([*raw, message(rng, 30)], converted)
    assert converted.reused - before == 30


def test_short_conversations_are_not_kept() -> None:
    converted = ConvertedMessages(message_size)
    raw = [{"role": "user", "content": "hi"}]
    wire(raw, converted)
    wire([*raw, {"role": "assistant", "content": "hello"}], converted)
    assert converted.reused == 0 and len(orjson.dumps(raw)) < MIN_BYTES
