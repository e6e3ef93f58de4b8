"""Byte-identical rendering of the reference outputs in ../shared/chat_templates (made with transformers)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.common.errors import InvalidRequestError
from services.parse.conversation import to_template_input
from services.parse.renderer import ChatTemplateRenderer
from tests.parse.support import FIXED_NOW, SHARED_TEMPLATES, conversation_from_openai

# Every family whose references pass tool-call arguments as objects (DeepSeek's want JSON text).
FAMILIES = (
    "qwen3", "qwen3-coder", "llama-3.1", "glm-4.6", "llama-3.2", "gpt-oss", "kimi-k2-instruct", "minimax-m2",
    "mistral-small-3.2", "nemotron-3-nano", "nemotron-nano-v2", "llama-nemotron-super-v1.5",
)


def _cases() -> list[Any]:
    if not SHARED_TEMPLATES.is_dir():
        return [pytest.param(None, None, marks=pytest.mark.skip(reason=f"{SHARED_TEMPLATES} is absent"))]
    cases = []
    for family in FAMILIES:
        meta = json.loads((SHARED_TEMPLATES / family / "reference" / "meta.json").read_text())
        for record in meta["renders"]:
            cases.append(pytest.param(family, record, id=f"{family}-{record['conversation']}-{record['variant']}"))
    return cases


@pytest.mark.parametrize(("family", "record"), _cases())
def test_reference_render(family: str, record: dict[str, Any]) -> None:
    fam_dir = SHARED_TEMPLATES / family
    template = (fam_dir / "chat_template.jinja").read_text(encoding="utf-8")
    conversations = json.loads((SHARED_TEMPLATES / "conversations.json").read_text(encoding="utf-8"))
    conv = next(c for c in conversations["conversations"] if c["id"] == record["conversation"])
    assert record["tool_call_arguments"] == "object"
    renderer = ChatTemplateRenderer(template, record["template_variables_from_special_tokens"], now=lambda: FIXED_NOW)
    data = to_template_input(conversation_from_openai(conv, record["kwargs"]))
    if record["status"] == "error":
        with pytest.raises(InvalidRequestError) as info:
            renderer.render(data)
        assert info.value.message == record["error"]
        return
    expected = (fam_dir / "reference" / record["file"]).read_text(encoding="utf-8")
    assert renderer.render(data) == expected
