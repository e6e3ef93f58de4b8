"""The renderer builds its own template environment (no private transformers name) and renders as transformers'
public ``render_jinja_template`` does, continuing a final message too; no module of the mesh imports a private
name of a dependency."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from services.parse.conversation import TemplateInput
from services.parse.renderer import ChatTemplateRenderer, alias_reasoning

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{% if m.reasoning_content %}[{{ m.reasoning_content }}]{% endif %}"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for b in m.content %}{{ b.text }}{% endfor %}{% endif %}"
    "{% generation %}</{{ m.role }}>{% endgeneration %}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}{% set ns = namespace(n=dict(a=1)) %}{{ ns.n | tojson }}"
)
CONVERSATIONS = [
    [{"role": "user", "content": "hi ü <b>"}, {"role": "assistant", "content": "hello  ", "reasoning": "think"}],
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "text", "text": "part"}]}],
    [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "thinking": "t"}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("continuing", [False, True])
def test_renders_what_transformers_public_renderer_renders(messages: list[dict[str, object]], continuing: bool) -> None:
    ours = ChatTemplateRenderer(TEMPLATE, {}).render(
        TemplateInput(messages=messages, add_generation_prompt=not continuing, continue_final_message=continuing)
    )
    # Older transformers releases do not alias reasoning fields themselves: hand them the aliased messages
    theirs = render_jinja_template(
        conversations=[alias_reasoning(messages)], chat_template=TEMPLATE,
        add_generation_prompt=not continuing, continue_final_message=continuing,
    )
    assert ours == theirs[0][0]


def test_aliasing_keeps_messages_without_reasoning_and_copies_the_rest() -> None:
    plain = {"role": "user", "content": "a"}
    with_reasoning = {"role": "assistant", "content": "b", "reasoning": "r"}
    out = alias_reasoning([plain, with_reasoning])
    assert out[0] is plain
    assert out[1] == {"thinking": "r", "role": "assistant", "content": "b", "reasoning": "r", "reasoning_content": "r"}
    assert "thinking" not in with_reasoning


def _private_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in {"services", "gateway", "__future__"}:
                continue
            parts = node.module.split(".") + [a.name for a in node.names]
            if any(p.startswith("_") for p in parts):
                found.append(f"{path.relative_to(ROOT)}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in {"services", "gateway"} and any(
                        p.startswith("_") for p in alias.name.split(".")):
                    found.append(f"{path.relative_to(ROOT)}: import {alias.name}")
    return found


def test_no_private_names_of_dependencies_are_imported() -> None:
    """Generated gRPC stubs (services/api/*_pb2*.py, made by grpcio-tools) are the generator's, not ours."""
    files = [p for d in ("services", "gateway") for p in (ROOT / d).rglob("*.py") if "_pb2" not in p.name]
    assert files
    assert [hit for p in files for hit in _private_imports(p)] == []
