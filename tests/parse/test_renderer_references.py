"""Byte-identical rendering of the reference outputs in tests/fixtures/chat_templates (made with transformers)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from services.common.errors import InvalidRequestError
from services.parse.conversation import MessageDicts, ToolDicts, to_template_input
from services.parse.renderer import ChatTemplateRenderer
from tests.parse.support import FIXED_NOW, TEMPLATE_FIXTURES, conversation_from_openai


def families() -> list[str]:
    """Every family with references (manifest.json lists them)."""
    manifest = json.loads((TEMPLATE_FIXTURES / "manifest.json").read_text(encoding="utf-8"))
    return sorted(manifest["families"])


def _cases() -> list[Any]:
    if not TEMPLATE_FIXTURES.is_dir():
        return [pytest.param(None, None, marks=pytest.mark.skip(reason=f"{TEMPLATE_FIXTURES} is absent"))]
    cases = []
    for family in families():
        meta = json.loads((TEMPLATE_FIXTURES / family / "reference" / "meta.json").read_text())
        for record in meta["renders"]:
            cases.append(pytest.param(family, record, id=f"{family}-{record['conversation']}-{record['variant']}"))
    return cases


@pytest.mark.parametrize(("family", "record"), _cases())
def test_reference_render(family: str, record: dict[str, Any]) -> None:
    fam_dir = TEMPLATE_FIXTURES / family
    template = (fam_dir / "chat_template.jinja").read_text(encoding="utf-8")
    conversations = json.loads((TEMPLATE_FIXTURES / "conversations.json").read_text(encoding="utf-8"))
    conv = next(c for c in conversations["conversations"] if c["id"] == record["conversation"])
    renderer = ChatTemplateRenderer(template, record["template_variables_from_special_tokens"], now=lambda: FIXED_NOW)
    # The renderer finds out from the template itself which form of arguments it takes.
    assert renderer.arguments_as_text == (record["tool_call_arguments"] == "json_string")
    data = to_template_input(conversation_from_openai(conv, record["kwargs"]),
                             arguments_as_text=renderer.arguments_as_text)
    if record["status"] == "error":
        with pytest.raises(InvalidRequestError) as info:
            renderer.render(data)
        assert info.value.message == record["error"]
        return
    expected = (fam_dir / "reference" / record["file"]).read_text(encoding="utf-8")
    assert renderer.render(data) == expected


@pytest.mark.parametrize("family", families() if TEMPLATE_FIXTURES.is_dir() else [])
def test_message_dicts_kept_across_turns_render_as_fresh_ones(family: str) -> None:
    """A held conversation renders its next turns from the same message objects with their dicts kept
    (``MessageDicts``), and its tools' dicts and ``tojson`` encodings too (``ToolDicts``); every prefix of
    every reference conversation renders as it does with fresh dicts, also when a later user message changes
    how an earlier message is replayed."""
    fam_dir = TEMPLATE_FIXTURES / family
    template = (fam_dir / "chat_template.jinja").read_text(encoding="utf-8")
    meta = json.loads((fam_dir / "reference" / "meta.json").read_text())
    conversations = json.loads((TEMPLATE_FIXTURES / "conversations.json").read_text(encoding="utf-8"))
    memo, tools = MessageDicts(), ToolDicts()
    checked = 0
    for record in meta["renders"]:
        if record["status"] == "error":
            continue
        conv = next(c for c in conversations["conversations"] if c["id"] == record["conversation"])
        renderer = ChatTemplateRenderer(template, record["template_variables_from_special_tokens"],
                                        now=lambda: FIXED_NOW)
        whole = conversation_from_openai(conv, record["kwargs"])
        for n in range(1, len(whole.messages) + 1):
            turn = dataclasses.replace(whole, messages=whole.messages[:n])
            fresh = to_template_input(turn, arguments_as_text=renderer.arguments_as_text)
            kept = to_template_input(turn, arguments_as_text=renderer.arguments_as_text, memo=memo,
                                     tool_memo=tools)
            try:
                expected = renderer.render(fresh)
            except InvalidRequestError:
                continue  # a prefix the template refuses (e.g. it must end with a user message)
            assert renderer.render(kept) == expected
            checked += 1
    assert checked
