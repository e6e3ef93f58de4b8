"""``services.parse.convert``: JSON text fields nested too deeply for ``json.loads`` are a 400 naming the field
(issue 14's fuzz finding: a RecursionError in the parse service reached gRPC clients as UNKNOWN)."""

from __future__ import annotations

import pytest

from services.api import chat_pb2
from services.common.errors import InvalidRequestError
from services.parse.convert import MAX_JSON_DEPTH, check_json_depth, conversation_from_proto

DEEP = "[" * 5000 + "]" * 5000


def request_with(field: str) -> tuple[chat_pb2.ChatRequest, str]:
    request = chat_pb2.ChatRequest(messages=[chat_pb2.Message(role="user", parts=[chat_pb2.Part(text="hi")])])
    if field == "kwargs":
        request.chat_template_kwargs_json = DEEP
        return request, "chat_template_kwargs_json"
    if field == "tool":
        request.tools.append(chat_pb2.Tool(name="t"))
        request.tools.append(chat_pb2.Tool(name="f", parameters_json=DEEP))
        return request, "tools[1].parameters_json"
    call = chat_pb2.ToolCall(id="c", name="f", arguments_json=DEEP)
    request.messages.append(chat_pb2.Message(role="assistant", parts=[chat_pb2.Part(text="x"),
                                                                      chat_pb2.Part(tool_call=call)]))
    return request, "messages[1].parts[1].tool_call.arguments_json"


@pytest.mark.parametrize("field", ["kwargs", "tool", "arguments"])
def test_deep_json_field_is_invalid_request_naming_it(field: str) -> None:
    request, param = request_with(field)
    with pytest.raises(InvalidRequestError) as info:
        conversation_from_proto(request)
    assert info.value.param == param


def test_depth_counts_brackets_outside_strings_only() -> None:
    check_json_depth("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH, "p")
    check_json_depth('["' + "[" * 1000 + '"]', "p")  # inside a string: not nesting
    check_json_depth('{"a": "\\"' + "{" * 1000 + '"}', "p")  # an escaped quote does not end the string
    with pytest.raises(InvalidRequestError):
        check_json_depth("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), "p")
