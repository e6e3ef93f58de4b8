"""Request shape limits (``services/parse/limits.py``): each a 400 naming the field and the option."""

from __future__ import annotations

import pytest

from services.api import chat_pb2
from services.common.errors import InvalidRequestError
from services.parse.limits import RequestLimits


def request(messages: int = 1, tools: int = 0, parts: int = 1, text: str = "hi") -> chat_pb2.ChatRequest:
    return chat_pb2.ChatRequest(
        messages=[chat_pb2.Message(role="user", parts=[chat_pb2.Part(text=text) for _ in range(parts)])
                  for _ in range(messages)],
        tools=[chat_pb2.Tool(name=f"t{i}", parameters_json="{}") for i in range(tools)])


@pytest.mark.parametrize(("bad", "param", "option"), [
    (request(messages=6), "messages", "--max-messages"),
    (request(tools=4), "tools", "--max-tools"),
    (request(parts=3), "messages[0].parts", "--max-message-parts"),
    (request(text="x" * 101), "messages[0].parts[0]", "--max-text-chars"),
])
def test_each_limit_is_a_400_naming_the_field(bad: chat_pb2.ChatRequest, param: str, option: str) -> None:
    limits = RequestLimits(messages=5, tools=3, parts=2, text_chars=100)
    with pytest.raises(InvalidRequestError) as info:
        limits.check(bad)
    assert info.value.param == param and option in info.value.message and info.value.http_status == 400


def test_within_limits_and_zero_means_none() -> None:
    RequestLimits(messages=5, tools=3, parts=2, text_chars=100).check(request(messages=5, tools=3, parts=2))
    RequestLimits(0, 0, 0, 0).check(request(messages=50, tools=40, parts=30, text="x" * 10_000))
    tool_call = chat_pb2.Part(tool_call=chat_pb2.ToolCall(id="c", name="f", arguments_json="{" + " " * 200 + "}"))
    with pytest.raises(InvalidRequestError, match=r"messages\[0\]\.parts\[0\]"):
        RequestLimits(text_chars=100).check(chat_pb2.ChatRequest(messages=[chat_pb2.Message(
            role="assistant", parts=[tool_call])]))
