"""Start-up probes of a chat template: what it does with inline system messages and with ``tools``.

:func:`decide_forms` renders small probe conversations through the same path every request takes
(``to_template_input``, then :class:`~services.parse.template_forms.TemplateForms`, then the template) and
returns the forms the model gets:

- inline system messages: the probe is a tool loop with a system message after a user message, after a tool
  result and at the end. A template keeps them in place (``as-is``) or hoists them into the leading system prompt
  (a marker renders before a message it came after), drops them (a marker is missing) or refuses them (the
  render raises); in the last three cases ``auto`` chooses ``user``;
- tools: the probe is rendered with one tool and without; the template renders tools when the tool's name
  appears only in the first.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

from services.common.errors import MeshError
from services.parse.conversation import (
    ChatMessage,
    Conversation,
    TemplateInput,
    TextPart,
    ToolCallPart,
    ToolSpec,
)
from services.parse.template_catalog import INLINE_SYSTEM_CHOICES
from services.parse.template_forms import InlineSystem, TemplateForms, call_id_form
from services.parse.tool_prompts import ToolPrompt

Prepare = Callable[[Conversation], TemplateInput]  # a conversation as a request's would reach the template
Render = Callable[[TemplateInput], str]

PROBE_TOOL = ToolSpec("harnessmesh_probe_tool", "Probe tool description (harnessmesh start-up probe).",
                      json.dumps({"type": "object", "properties": {"probe_argument": {"type": "string"}}}))
_CALL_ID = "call_0123456789abcdef01234567"


def _text(role: str, text: str, *, tool_call_id: str = "", name: str = "") -> ChatMessage:
    return ChatMessage(role, (TextPart(text),), tool_call_id=tool_call_id, name=name)


def _probe_messages(inline: bool) -> tuple[tuple[ChatMessage, ...], list[str]]:
    """The probe tool loop and its markers in the order they were sent."""
    steps: list[tuple[ChatMessage, str, bool]] = [
        (_text("system", "PROBE_SYSTEM"), "PROBE_SYSTEM", False),
        (_text("user", "PROBE_USER_ONE"), "PROBE_USER_ONE", False),
        (_text("system", "PROBE_INLINE_AFTER_USER"), "PROBE_INLINE_AFTER_USER", True),
        (ChatMessage("assistant", (TextPart("PROBE_CALLING"), ToolCallPart(_CALL_ID, PROBE_TOOL.name,
                                                                           '{"probe_argument": "x"}'))), "", False),
        (_text("tool", "PROBE_RESULT", tool_call_id=_CALL_ID, name=PROBE_TOOL.name), "PROBE_RESULT", False),
        (_text("system", "PROBE_INLINE_AFTER_TOOL"), "PROBE_INLINE_AFTER_TOOL", True),
        (_text("assistant", "PROBE_ANSWER"), "PROBE_ANSWER", False),
        (_text("user", "PROBE_USER_TWO"), "PROBE_USER_TWO", False),
        (_text("system", "PROBE_INLINE_STEER"), "PROBE_INLINE_STEER", True),
    ]
    kept = [(m, marker) for m, marker, is_inline in steps if inline or not is_inline]
    return tuple(m for m, _ in kept), [marker for _, marker in kept if marker]


def _render(render: Render, prepare: Prepare, forms: TemplateForms, conversation: Conversation) -> str:
    return render(forms.apply(prepare(conversation)))


def _error(exc: Exception) -> str:
    message = exc.message if isinstance(exc, MeshError) else str(exc)
    return (message or type(exc).__name__).splitlines()[0][:160]


def inline_system_behaviour(render: Render, prepare: Prepare, forms: TemplateForms) -> tuple[bool, str]:
    """Whether the template keeps inline system messages in place under ``forms``, and what it does with them."""
    forms = replace(forms, refuse_unrendered_tools=False)  # the probe's tool must not make it a refusal
    base, _ = _probe_messages(inline=False)
    try:
        _render(render, prepare, forms, Conversation(base, tools=(PROBE_TOOL,)))
    except Exception as exc:  # a template's failure is data here, whatever it raised
        return True, f"the probe conversation does not render without inline system messages ({_error(exc)})"
    messages, markers = _probe_messages(inline=True)
    try:
        text = _render(render, prepare, forms, Conversation(messages, tools=(PROBE_TOOL,)))
    except Exception as exc:
        return False, f"the template refuses an inline system message ({_error(exc)})"
    missing = [m for m in markers if m not in text]
    if missing:
        return False, f"the template drops inline system messages ({', '.join(missing)} not rendered)"
    at = [text.index(m) for m in markers]
    for earlier, later, name in zip(at, at[1:], markers[1:], strict=False):
        if later < earlier:
            return False, f"the template hoists inline system messages ({name} renders before the message it follows)"
    return True, "the template renders inline system messages in place"


def tools_behaviour(render: Render, prepare: Prepare, forms: TemplateForms) -> tuple[bool, str]:
    """Whether the template renders the request's tools (probe with and without one tool)."""
    messages = (_text("system", "PROBE_SYSTEM"), _text("user", "PROBE_USER_ONE"))
    try:
        with_tools = _render(render, prepare, forms, Conversation(messages, tools=(PROBE_TOOL,)))
        without = _render(render, prepare, forms, Conversation(messages))
    except Exception as exc:
        return True, f"the probe does not render ({_error(exc)}); assumed to render tools"
    if PROBE_TOOL.name in with_tools and PROBE_TOOL.name not in without:
        return True, "the template renders tools"
    return False, "the template ignores the request's tools (a render with and one without them differ in nothing)"


def decide_forms(
    template: str, render: Render, prepare: Prepare, *, inline_system: str = "auto",
    tool_prompt: ToolPrompt | None = None, refuse_unrendered_tools: bool = False, source: str = "--inline-system",
) -> TemplateForms:
    """The forms for ``template`` (``render`` renders a template input, ``prepare`` makes one as requests do).

    ``inline_system``: one of INLINE_SYSTEM_CHOICES (``source`` names where it was set, for the reason);
    ``tool_prompt``: used only when the template does not render tools itself.
    """
    if inline_system not in INLINE_SYSTEM_CHOICES:
        raise ValueError(f"unknown inline system policy {inline_system!r}; valid: {', '.join(INLINE_SYSTEM_CHOICES)}")
    forms = TemplateForms(call_ids=call_id_form(template), refuse_unrendered_tools=refuse_unrendered_tools)
    renders, tools_reason = tools_behaviour(render, prepare, forms)
    forms = replace(forms, renders_tools=renders, tools_reason=tools_reason,
                    tool_prompt=None if renders else tool_prompt)
    if inline_system != "auto":
        chosen: InlineSystem = "user" if inline_system == "user" else "as-is"
        return replace(forms, inline_system=chosen, inline_system_reason=f"set by {source}")
    in_place, why = inline_system_behaviour(render, prepare, forms)
    if in_place:
        return replace(forms, inline_system="as-is", inline_system_reason=f"auto: {why}")
    folded = replace(forms, inline_system="user")
    ok, folded_why = inline_system_behaviour(render, prepare, folded)
    if not ok:  # the user form fails too: nothing better to hand the template than what was sent
        return replace(forms, inline_system="as-is", inline_system_reason=f"auto: {why}; the user form fails too "
                                                                          f"({folded_why})")
    return replace(folded, inline_system_reason=f"auto: {why}: sent as user reminders")
