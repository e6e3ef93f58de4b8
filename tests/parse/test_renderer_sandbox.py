"""The renderer's fast paths for ``dict.key`` (and a string's, a loop's, a namespace's public attributes) give
what Hugging Face's sandboxed render gives.

``services.parse.renderer`` answers attribute access on a plain dict without the sandbox's
raise-and-catch of ``AttributeError``, and reads a str's, loop's or namespace's public attributes straight
(only ``format`` / ``format_map`` keep the sandbox's wrapping); every case below is rendered by
``transformers`` itself too (its own compiled template, a fresh sandbox without our hooks) and the two must
agree.
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
    "string methods": EACH + "{{ m.role.upper() }}{{ m.content.strip().startswith('b') }}{{ m.role.nope }}|" + END,
    "loop": EACH + "{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.nope }}|" + END,
    "namespace attributes": "{% set ns = namespace(prev='', f='{}'.format) %}" + EACH
                            + "{{ ns.prev }}{% set ns.prev = m.role %}{{ ns.nope }}|" + END + "{{ ns.f('x') }}",
    "str.format stays sandboxed": EACH + "{{ '{}:{}'.format(m.role, loop.index) }}" + END,
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


def _outcome(render: object) -> str:
    try:
        return str(render())  # type: ignore[operator]
    except (InvalidRequestError, jinja2.exceptions.SecurityError, jinja2.exceptions.UndefinedError) as exc:
        return f"refused: {type(exc).__name__}"


@pytest.mark.parametrize("template", [
    "{{ '{0.__class__}'.format(messages) }}",
    "{{ '{a.__class__}'.format_map({'a': 1}) }}",
    "{% set ns = namespace(f='{0.__class__}'.format) %}{{ ns.f(messages) }}",
    "{{ 'x'.__class__ }}",
    "{{ loop }}{% for m in messages %}{{ loop.__class__ }}{% endfor %}",
])
def test_format_and_private_attributes_of_plain_objects_stay_sandboxed(template: str) -> None:
    ours = _outcome(lambda: ChatTemplateRenderer(template, {}).render(TemplateInput(messages=MESSAGES)))
    theirs = _outcome(lambda: reference(template))
    assert ours == theirs and "class" not in ours  # the sandbox's answer: nothing leaks


def test_a_templates_own_namespace_is_read_without_the_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    """``namespace()`` in a chat template is transformers' subclass of jinja's Namespace (one per compiled
    template): its public attributes take the fast path too (~2.5 us less per ``ns.prev``; a 100k-token
    agent session's render read it 172 times), while ``format`` values keep the sandbox's wrapping."""
    from jinja2.sandbox import SandboxedEnvironment

    sandboxed: list[str] = []
    original = SandboxedEnvironment.getattr

    def spy(self: SandboxedEnvironment, obj: object, attribute: str) -> object:
        sandboxed.append(attribute)
        return original(self, obj, attribute)

    monkeypatch.setattr(SandboxedEnvironment, "getattr", spy)
    template = ("{% set ns = namespace(prev='', f='{}'.format) %}" + EACH
                + "{{ ns.prev }}{% set ns.prev = m.role %}|" + END + "{{ ns.f('x') }}{# namespace fast path #}")
    ours = ChatTemplateRenderer(template, {}).render(TemplateInput(messages=MESSAGES, add_generation_prompt=False))
    assert "prev" not in sandboxed and "f" in sandboxed  # ns.prev read straight; ns.f (a format method) was not
    assert ours == reference(template)
