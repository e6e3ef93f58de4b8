"""The Messages API's next turn takes the messages it repeats from a recent request's conversion
(``gateway.converted_messages``): whatever the edits, and whatever ``clear_thinking`` keeps, the result is
exactly what converting every message afresh gives, tool results named by tool calls on either side of the
first new message included."""

from __future__ import annotations

import random
from typing import Any

import orjson

from gateway.apis.anthropic.convert import ConvertedMessage, chat_request, converted_messages
from gateway.apis.anthropic.models import MessagesRequest
from gateway.converted_messages import ConvertedMessages
from tests.gateway.conversation_edits import edited_conversations

WORDS = ["alpha", "beta", "gamma", "parse", "tool", "read", "écrire", "工具"]
TOOLS = ["read", "write", "grep"]


def text(rng: random.Random, most: int = 300) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, most)))


def assistant(rng: random.Random, n: int) -> dict[str, Any]:
    if rng.random() < 0.2:
        return {"role": "assistant", "content": text(rng)}
    blocks: list[dict[str, Any]] = []
    if rng.random() < 0.6:
        blocks.append({"type": "thinking", "thinking": text(rng), "signature": f"sig{n}"})
    if rng.random() < 0.5:
        blocks.append({"type": "text", "text": text(rng)})
    for k in range(rng.randrange(0, 3)):
        blocks.append({"type": "tool_use", "id": f"toolu_{n}_{k}", "name": rng.choice(TOOLS),
                       "input": {"path": f"{n}.py", "n": k}})
    return {"role": "assistant", "content": blocks}


def user(rng: random.Random, calls: list[str]) -> dict[str, Any]:
    if not calls or rng.random() < 0.3:
        return {"role": "user", "content": text(rng) if rng.random() < 0.5 else [{"type": "text", "text": text(rng)}]}
    blocks: list[dict[str, Any]] = []
    for call in rng.sample(calls, rng.randrange(1, min(3, len(calls)) + 1)):
        content: Any = text(rng) if rng.random() < 0.5 else [{"type": "text", "text": text(rng)}]
        blocks.append({"type": "tool_result", "tool_use_id": call, "content": content,
                       "is_error": rng.random() < 0.1})
        if rng.random() < 0.3:
            blocks.append({"type": "text", "text": text(rng)})
    return {"role": "user", "content": blocks}


def grow(rng: random.Random, messages: list[dict[str, Any]], turns: int) -> None:
    """``turns`` more assistant + user pairs; tool results may answer any earlier call."""
    for _ in range(turns):
        messages.append(assistant(rng, len(messages)))
        calls = [b["id"] for m in messages if m["role"] == "assistant" and isinstance(m["content"], list)
                 for b in m["content"] if b["type"] == "tool_use"]
        messages.append(user(rng, calls))


def body(rng: random.Random, messages: list[dict[str, Any]], system: str) -> dict[str, Any]:
    out: dict[str, Any] = {"model": "m", "max_tokens": 64, "system": system, "messages": messages}
    clear = rng.random()
    if clear < 0.5:
        keep: Any = rng.choice([{"type": "thinking_turns", "value": rng.randrange(0, 4)}, "all"])
        out["context_management"] = {"edits": [{"type": "clear_thinking_20251015", "keep": keep}]}
    return out


def wire(raw: dict[str, Any], converted: ConvertedMessages[ConvertedMessage] | None) -> list[bytes]:
    parsed = orjson.loads(orjson.dumps(raw))  # what read_json hands over
    request = chat_request(MessagesRequest.model_validate(parsed), {}, model="m", request_id="r", strip=True,
                           raw_messages=parsed["messages"], converted=converted)
    return [m.SerializeToString() for m in request.messages]


def test_turns_with_random_edits_convert_as_afresh() -> None:
    rng = random.Random(14)
    converted = converted_messages()
    system = text(rng)

    def after_assistant(messages: list[dict[str, Any]], at: int) -> int:
        return at + 1 if messages[at]["role"] == "user" else at

    for messages, edit in edited_conversations(rng, lambda: [{"role": "user", "content": text(rng)}],
                                               lambda messages, turns: grow(rng, messages, turns),
                                               cut_at=after_assistant):
        if 0.8 <= edit < 0.9:
            system = text(rng)  # a changed system prompt
        raw = body(rng, messages, system)
        assert wire(raw, converted) == wire(raw, None)
    assert converted.reused > 0


def test_a_next_turn_reuses_every_message_it_repeats() -> None:
    rng = random.Random(3)
    converted = converted_messages()
    messages = [{"role": "user", "content": text(rng)}]
    grow(rng, messages, 15)
    raw = {"model": "m", "max_tokens": 64, "messages": messages}
    wire(raw, converted)
    before = converted.reused
    grow(rng, messages, 1)
    assert wire(raw, converted) == wire(raw, None)
    assert converted.reused - before == 31


def test_a_turn_whose_thinking_is_cleared_converts_again() -> None:
    """``clear_thinking`` keeping the latest turn's thinking: the turn before it loses its thinking once the
    next turn arrives, so it is converted again rather than taken with the thinking it had."""
    rng = random.Random(5)
    converted = converted_messages()
    messages: list[dict[str, Any]] = [{"role": "user", "content": text(rng)}]
    for _ in range(6):
        messages.append({"role": "assistant", "content": [
            {"type": "thinking", "thinking": text(rng), "signature": "s"}, {"type": "text", "text": text(rng)}]})
        messages.append({"role": "user", "content": text(rng, 1000)})
    keep_one = {"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}]}
    raw = {"model": "m", "max_tokens": 64, "messages": messages, "context_management": keep_one}
    wire(raw, converted)
    before = converted.reused
    messages.extend([{"role": "assistant", "content": [
        {"type": "thinking", "thinking": "new", "signature": "s"}, {"type": "text", "text": "ok"}]},
        {"role": "user", "content": "next"}])
    assert wire(raw, converted) == wire(raw, None)
    assert converted.reused - before == len(messages) - 2 - 2  # all but the last old turn and the new two
