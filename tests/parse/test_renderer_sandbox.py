"""The renderer's fast path for ``dict.key`` gives what Hugging Face's sandboxed render gives.

``services.parse.renderer`` answers attribute access on a plain dict without the sandbox's
raise-and-catch of ``AttributeError``; every case below is rendered by ``transformers`` itself too
(its own compiled template, a fresh sandbox without our hooks) and the two must agree.
"""

from __future__ import annotations

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from services.common.errors import InvalidRequestError
from services.parse.conversation import TemplateInput
from services.parse.renderer import ChatTemplateRenderer

MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hi", "items": "a key named like a dict method"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
]
EACH, END = "{% for m in messages %}", "{% endfor %}"

TEMPLATES = {
    "keys": EACH + "[{{ m.role }}:{{ m.content }}]" + END,
    "missing key is undefined": EACH + "{{ m.reasoning_content is defined }}{{ m.nope }}|" + END,
    "method names stay methods": EACH + "{{ m.items() | list | length }}{{ m.get('role') }}" + END,
    "nested": EACH + "{% for c in m.tool_calls or [] %}{{ c.function.name }}{{ c.function.arguments.x }}"
              "{% endfor %}" + END,
    "item syntax": EACH + "{{ m['role'] }}{{ m['items'] is string }}{{ m.items is string }}" + END,
    "namespace": "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
}


def reference(template: str) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    return env.from_string(template).render(messages=MESSAGES, tools=None, add_generation_prompt=False)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_fast_path_renders_what_the_sandbox_renders(name: str) -> None:
    template = TEMPLATES[name]
    ours = ChatTemplateRenderer(template, {}).render(TemplateInput(messages=MESSAGES, add_generation_prompt=False))
    assert ours == reference(template)


def test_private_names_stay_refused() -> None:
    with pytest.raises((InvalidRequestError, jinja2.exceptions.SecurityError)):
        ChatTemplateRenderer("{{ messages[0].__class__.__subclasses__() }}", {}).render(
            TemplateInput(messages=MESSAGES))
