"""A tool list's template dicts, schemas and ``tojson`` encodings kept between turns (``ToolDicts``,
``services.parse.json_memo``) give exactly what making them afresh gives."""

from __future__ import annotations

import json

import pytest

from services.common.errors import InvalidRequestError
from services.common.model_dir import load_model_dir
from services.parse.conversation import ChatMessage, Conversation, TextPart, ToolDicts, ToolSpec, _tool_dict
from services.parse.json_memo import MEMO, JsonMemo
from services.parse.model_format import ModelFormat

SCHEMA = {"type": "object", "properties": {"path": {"type": "string", "description": "ünïcode"}}}
TOOLS = (
    ToolSpec("read", "Read a file", json.dumps(SCHEMA)),
    ToolSpec("noop", "No parameters", ""),
    ToolSpec("odd", "A schema that is no object", "[1, 2]"),
)


def conversation(tools: tuple[ToolSpec, ...], n: int) -> Conversation:
    messages = tuple(ChatMessage("user" if i % 2 == 0 else "assistant", (TextPart(f"turn {i}"),)) for i in range(n))
    return Conversation(messages=messages, tools=tools)


def test_dicts_and_schemas_are_what_a_fresh_parse_gives() -> None:
    memo = ToolDicts()
    assert memo.dicts(TOOLS) == [_tool_dict(i, t) for i, t in enumerate(TOOLS)]
    assert memo.schemas(TOOLS) == {"read": SCHEMA, "noop": {}}  # a JSON array is no schema
    again = tuple(ToolSpec(t.name, t.description, t.parameters_json) for t in TOOLS)  # equal, other objects
    assert memo.dicts(again) is memo.dicts(TOOLS)


def test_a_bad_tool_is_refused_every_time_and_never_kept() -> None:
    memo = ToolDicts()
    bad = (*TOOLS, ToolSpec("bad", "", "{not json"))
    for _ in range(2):
        with pytest.raises(InvalidRequestError) as info:
            memo.dicts(bad)
        assert info.value.param == "tools[3].parameters_json"


def test_the_memo_is_bounded_and_forgets_its_encodings() -> None:
    memo = ToolDicts(max_lists=2)
    before = len(MEMO)
    lists = [(ToolSpec(f"t{i}", "", json.dumps(SCHEMA)),) for i in range(5)]
    for tools in lists:
        memo.dicts(tools)
    assert len(MEMO) == before + 2


def test_renders_with_kept_tools_equal_fresh_renders_turn_after_turn() -> None:
    kept = ModelFormat(load_model_dir(None), reasoning_parser="qwen3", tool_parser="hermes")
    for n in range(1, 6):
        fresh = ModelFormat(load_model_dir(None), reasoning_parser="qwen3", tool_parser="hermes")
        tools = tuple(ToolSpec(t.name, t.description, t.parameters_json) for t in TOOLS)  # each turn's own copy
        assert kept.render(conversation(tools, n)) == fresh.render(conversation(tools, n))
        assert kept.build_prompt(conversation(tools, n)).schemas == {"read": SCHEMA, "noop": {}}


def test_json_memo_encodes_a_registered_object_once_per_arguments() -> None:
    memo, calls = JsonMemo(), []

    def encode(indent: int | None) -> str:
        calls.append(indent)
        return json.dumps(SCHEMA, indent=indent)

    stranger = dict(SCHEMA)
    assert memo.encoded(stranger, (), {}, lambda: encode(None)) == json.dumps(SCHEMA)
    assert memo.encoded(stranger, (), {}, lambda: encode(None)) == json.dumps(SCHEMA)
    assert calls == [None, None]  # not registered: encoded each time
    memo.register(SCHEMA)
    for _ in range(3):
        assert memo.encoded(SCHEMA, (), {}, lambda: encode(None)) == json.dumps(SCHEMA)
        assert memo.encoded(SCHEMA, (), {"indent": 2}, lambda: encode(2)) == json.dumps(SCHEMA, indent=2)
    assert calls == [None, None, None, 2]
    memo.forget(SCHEMA)
    memo.encoded(SCHEMA, (), {}, lambda: encode(None))
    assert calls[-1] is None and len(calls) == 5
