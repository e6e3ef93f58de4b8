"""The Responses API's next turn takes the runs of input items it repeats from a recent request's conversion
(``gateway.converted_messages``): whatever the edits, the request and the history it stores are exactly what
converting every item afresh gives: assistant-side items merged into one turn, outputs named by calls on
either side of the first new item, compaction items, ``additional_tools`` and a stored history included."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from gateway.apis.responses.compaction import compaction_sealer
from gateway.apis.responses.convert import ConvertedRun, chat_request, converted_runs
from gateway.apis.responses.models import ResponsesRequest
from gateway.converted_messages import ConvertedMessages
from services.api import chat_pb2
from services.common.errors import InvalidRequestError
from tests.gateway.conversation_edits import edited_conversations

WORDS = ["alpha", "beta", "gamma", "parse", "tool", "read", "écrire", "工具"]

SEALER = compaction_sealer("test-key")


def text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 400)))


def content(rng: random.Random, part: str) -> Any:
    return text(rng) if rng.random() < 0.5 else [{"type": part, "text": text(rng)}]


def assistant_items(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """One model turn as a client replays it: reasoning, text, calls, in some order."""
    items: list[dict[str, Any]] = []
    for k in range(rng.randrange(1, 4)):
        kind = rng.random()
        if kind < 0.25:
            reasoning: dict[str, Any] = {"type": "reasoning", "summary": []}
            if rng.random() < 0.7:
                reasoning["summary"] = [{"type": "summary_text", "text": text(rng)}]
            items.append(reasoning)  # an empty summary converts to nothing
        elif kind < 0.45:
            items.append({"type": "message", "role": "assistant", "content": content(rng, "output_text")})
        elif kind < 0.8:
            items.append({"type": "function_call", "call_id": f"call_{n}_{k}", "name": rng.choice(["read", "grep"]),
                          "arguments": orjson.dumps({"path": f"{n}.py"}).decode()})
        else:
            items.append({"type": "custom_tool_call", "call_id": f"call_{n}_{k}", "name": "apply_patch",
                          "input": text(rng)})
    if rng.random() < 0.1:  # a compaction this gateway made: its summary as a user message, between assistant items
        items.append({"type": "compaction", "encrypted_content": SEALER.seal(text(rng))})
    return items


def client_items(rng: random.Random, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Outputs for some calls (any earlier one), and maybe a user or developer message."""
    items: list[dict[str, Any]] = []
    for call in rng.sample(calls, min(len(calls), rng.randrange(0, 3))):
        kind = "custom_tool_call_output" if call["type"] == "custom_tool_call" else "function_call_output"
        items.append({"type": kind, "call_id": call["call_id"], "output": content(rng, "input_text")})
    if not items or rng.random() < 0.3:
        role = rng.choice(["user", "user", "developer"])
        item: dict[str, Any] = {"role": role, "content": content(rng, "input_text")}
        if rng.random() < 0.5:
            item["type"] = "message"
        items.append(item)
    return items


def grow(rng: random.Random, items: list[dict[str, Any]], turns: int) -> None:
    for _ in range(turns):
        items.extend(assistant_items(rng, len(items)))
        calls = [i for i in items if i.get("type") in ("function_call", "custom_tool_call")]
        items.extend(client_items(rng, calls))


def convert(raw: dict[str, Any], history: list[chat_pb2.Message],
            converted: ConvertedMessages[ConvertedRun] | None) -> tuple[list[bytes], list[bytes], list[bytes]]:
    parsed = orjson.loads(orjson.dumps(raw))  # what read_json hands over
    out = chat_request(ResponsesRequest.model_validate(parsed), {}, history, model="m", request_id="r",
                       converted=converted, sealer=SEALER)
    return ([m.SerializeToString() for m in out.chat.messages], [t.SerializeToString() for t in out.chat.tools],
            [m.SerializeToString() for m in out.history])


def test_turns_with_random_edits_convert_as_afresh() -> None:
    rng = random.Random(12)
    converted = converted_runs()
    history = [chat_pb2.Message(role="assistant", parts=[chat_pb2.Part(text="stored")])]
    for items, _ in edited_conversations(rng, lambda: [{"role": "user", "content": text(rng)}],
                                         lambda items, turns: grow(rng, items, turns)):
        raw = {"model": "m", "instructions": text(rng) if rng.random() < 0.3 else "be brief", "input": items}
        if rng.random() < 0.05:
            raw["input"] = [{"type": "additional_tools", "tools": [{"type": "function", "name": "extra"}]}, *items]
        stored = history if rng.random() < 0.1 else []
        assert convert(raw, stored, converted) == convert(raw, stored, None)
    assert converted.reused > 0


def test_a_next_turn_reuses_every_run_it_repeats() -> None:
    rng = random.Random(4)
    converted = converted_runs()
    items: list[dict[str, Any]] = [{"role": "user", "content": text(rng)}]
    for n in range(20):
        items.append({"type": "function_call", "call_id": f"c{n}", "name": "read", "arguments": "{}"})
        items.append({"type": "function_call_output", "call_id": f"c{n}", "output": text(rng)})
    raw = {"model": "m", "input": items}
    convert(raw, [], converted)
    before = converted.reused
    items.append({"type": "function_call", "call_id": "c20", "name": "grep", "arguments": "{}"})
    items.append({"type": "function_call_output", "call_id": "c20", "output": "found"})
    assert convert(raw, [], converted) == convert(raw, [], None)
    # runs: [user, call 0], [output 0, call 1], ..., [output 19]: the last one gains call 20, so 20 are reused
    assert converted.reused - before == 20


@pytest.mark.parametrize("kind", [{"role": "user"}, [], 7])
def test_an_item_type_that_is_not_a_string_is_a_400_with_or_without_the_memo(kind: Any) -> None:
    # found by bench/fuzz.py: cutting the input into runs looked the type up in a set (a 500 for a dict or a list)
    raw = {"model": "m", "input": [{"role": "user", "content": "hi"}, {"type": kind, "call_id": "c1", "output": "22"}]}
    for converted in (converted_runs(), None):
        with pytest.raises(InvalidRequestError) as info:
            convert(raw, [], converted)
        assert info.value.param == "input[1].type"
