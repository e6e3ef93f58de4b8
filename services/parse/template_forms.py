"""The forms a chat template polices, fitted before each render: inline system messages, tool-call ids, tools.

Templates differ in what they accept of a conversation a harness sends, and fail in different ways:

- an inline (non-leading) ``system`` message (Claude Code's reminders, todo lists, a mid-turn steer) is kept in
  place by some templates, hoisted into the leading system prompt by others (the prompt's head changes every
  turn: no prefix cache), dropped by others (the model never sees it) or refused (a 400 for every turn after).
  The ``user`` form hands it to the template as user text, wrapped as Claude Code wraps its own reminders
  (``<system-reminder>...</system-reminder>``) and joined to the neighbouring user or tool message, so role
  alternation holds and the text stays where it was sent;
- tool-call ids: Mistral's templates accept only 9 alphanumeric characters. Ids of another shape are mapped to
  9 characters derived from the id itself (the same every turn: the prompt stays stable), in the assistant's
  tool call and the tool result alike; the ids clients see are never changed;
- tools: a template that never renders ``tools`` gets them in its system message from a tool-prompt template
  (``tool_prompts.py``), or the request is refused when the operator asks for that.

What a template needs is decided once at start-up by rendering probe conversations (``template_probe.py``).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import operator
import re
import secrets
import string
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from services.common.errors import InvalidRequestError
from services.parse.conversation import TemplateInput
from services.parse.tool_prompts import ToolPrompt

InlineSystem = Literal["as-is", "user"]
CallIdForm = Literal["any", "alnum9"]

REMINDER_OPEN = "<system-reminder>\n"
REMINDER_CLOSE = "\n</system-reminder>"
_JOIN = "\n\n"


def as_reminder(text: str) -> str:
    """``text`` wrapped as a system reminder (left as it is when the harness wrapped it already)."""
    stripped = text.strip()
    if stripped.startswith("<system-reminder>") and stripped.endswith("</system-reminder>"):
        return text
    return REMINDER_OPEN + text + REMINDER_CLOSE


def _joined(message: dict[str, Any], text: str, *, before: bool = False) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, str) or not content:
        return {**message, "content": text}
    return {**message, "content": text + _JOIN + content if before else content + _JOIN + text}


def _reminders(systems: Sequence[dict[str, Any]]) -> str:
    return _JOIN.join(as_reminder(m.get("content") or "") for m in systems)


def _reminders_after(base: dict[str, Any], run: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return _joined(base, _reminders(run))


def _reminders_before(run: Sequence[dict[str, Any]], base: dict[str, Any]) -> dict[str, Any]:
    return _joined(base, _reminders(run), before=True)


def _reminder_message(run: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {"role": "user", "content": _reminders(run)}


class MadeDicts:
    """Template dicts made from other template dicts, by the identity of those (bounded, thread-safe).

    A conversation the parse service holds between turns renders the very same message dicts every turn
    (``conversation.MessageDicts``), so a joined reminder or a message with fitted ids is made once per session.
    """

    def __init__(self, max_items: int = 100_000) -> None:
        self._max = max_items
        self._items: OrderedDict[int, tuple[tuple[dict[str, Any], ...], dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, sources: tuple[dict[str, Any], ...], make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The dict ``make`` made of ``sources`` (kept alive with it, so their ids name no other objects); keyed
        by the first source, the others compared."""
        item = self._items.get(id(sources[0]))
        if item is not None and len(item[0]) == len(sources) and all(map(operator.is_, item[0], sources)):
            return item[1]
        made = make()
        with self._lock:
            self._items[id(sources[0])] = (sources, made)
            while len(self._items) > self._max:
                self._items.popitem(last=False)
        return made


def _unmade(sources: tuple[dict[str, Any], ...], make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    return make()


def fold_inline_system(messages: list[dict[str, Any]], made: MadeDicts | None = None) -> list[dict[str, Any]]:
    """The ``user`` form: each system message after the first message becomes a system reminder in the user or
    tool message before it, else in the user or tool message after it, else a user message of its own.

    Joining backwards first keeps the render of a turn's history the same on every later turn (the message a
    reminder follows never changes). The messages are not edited: a joined one is a new dict (from ``made``, when
    given, for the same dicts joined before).
    """
    if not any(m["role"] == "system" for m in itertools.islice(messages, 1, None)):
        return messages
    get = made.get if made is not None else _unmade
    out: list[dict[str, Any]] = []
    after: list[dict[str, Any]] = []  # system messages that join out[-1]
    pending: list[dict[str, Any]] = []  # system messages with no user or tool message before them

    def join_after() -> None:
        if after:
            base, run = out[-1], tuple(after)
            out[-1] = get((base, *run), functools.partial(_reminders_after, base, run))
            after.clear()

    for i, message in enumerate(messages):
        if i and message["role"] == "system":
            if out and out[-1]["role"] in ("user", "tool") and not pending:
                after.append(message)
            else:
                pending.append(message)
            continue
        join_after()
        if pending:
            run = tuple(pending)
            if message["role"] in ("user", "tool"):
                message = get((*run, message), functools.partial(_reminders_before, run, message))
            else:
                out.append(get(run, functools.partial(_reminder_message, run)))
            pending.clear()
        out.append(message)
    join_after()
    if pending:
        run = tuple(pending)
        out.append(get(run, functools.partial(_reminder_message, run)))
    return out


_ALNUM = string.ascii_letters + string.digits
_ALNUM9 = re.compile(r"[A-Za-z0-9]{9}")
# Mistral's templates: ``tool_call.id|length != 9`` / "Tool call IDs should be alphanumeric strings with length 9"
_NINE_CHAR_RULE = re.compile(r"(?:id\s*\|\s*length\s*!=\s*9|IDs should be alphanumeric strings with length 9)")


def call_id_form(template: str) -> CallIdForm:
    """``alnum9`` when ``template`` requires tool-call ids of 9 alphanumeric characters (Mistral's), else ``any``."""
    return "alnum9" if _NINE_CHAR_RULE.search(template) else "any"


@functools.lru_cache(maxsize=65_536)
def alnum9_id(call_id: str) -> str:
    """``call_id`` itself when it is 9 alphanumeric characters, else 9 derived from it (a digest in base 62)."""
    if _ALNUM9.fullmatch(call_id):
        return call_id
    number = int.from_bytes(hashlib.blake2b(call_id.encode(), digest_size=8).digest(), "big")
    out = []
    for _ in range(9):
        number, digit = divmod(number, 62)
        out.append(_ALNUM[digit])
    return "".join(out)


def new_alnum9_id() -> str:
    """A new tool-call id of 9 alphanumeric characters (what vLLM mints for Mistral models)."""
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


def _fitted(message: dict[str, Any]) -> dict[str, Any]:
    fitted = message
    calls = message.get("tool_calls")
    if calls and any("id" in c and alnum9_id(c["id"]) != c["id"] for c in calls):
        fitted = {**message, "tool_calls": [{**c, "id": alnum9_id(c["id"])} if "id" in c else c for c in calls]}
    call_id = message.get("tool_call_id")
    if isinstance(call_id, str) and alnum9_id(call_id) != call_id:
        fitted = {**fitted, "tool_call_id": alnum9_id(call_id)}
    return fitted


def fit_call_ids(messages: list[dict[str, Any]], made: MadeDicts | None = None) -> list[dict[str, Any]]:
    """``messages`` with every tool-call id (assistant ``tool_calls[].id``, tool ``tool_call_id``) as
    :func:`alnum9_id` maps it; messages whose ids fit already are the same objects."""
    get = made.get if made is not None else _unmade
    out = messages
    for i, message in enumerate(messages):
        if "tool_calls" not in message and "tool_call_id" not in message:
            continue
        fitted = get((message,), functools.partial(_fitted, message))
        if fitted is not message:
            if out is messages:
                out = list(messages)
            out[i] = fitted
    return out


@dataclass(frozen=True)
class TemplateForms:
    """What one model's template is handed instead of the conversation as sent (decided at start-up).

    ``inline_system``: ``as-is`` or ``user`` (see :func:`fold_inline_system`), and why. ``call_ids``: the id form
    the template requires. ``renders_tools``: whether the template shows the request's tools; when it does not,
    ``tool_prompt`` (if any) puts them in the system message, else a request with tools is served with them
    unseen (``refuse_unrendered_tools``: refused with a 400 instead).
    """

    inline_system: InlineSystem = "as-is"
    inline_system_reason: str = "default"
    call_ids: CallIdForm = "any"
    renders_tools: bool = True
    tools_reason: str = ""
    tool_prompt: ToolPrompt | None = None
    refuse_unrendered_tools: bool = False
    made: MadeDicts = field(default_factory=MadeDicts, compare=False, repr=False)

    @property
    def tools_unrendered(self) -> bool:
        """True when a request's tools reach the model nowhere (the template ignores them, no tool prompt)."""
        return not self.renders_tools and self.tool_prompt is None

    def apply(self, data: TemplateInput) -> TemplateInput:
        """``data`` in the forms the template accepts (``data`` itself when nothing changes)."""
        messages = data.messages
        if self.inline_system == "user":
            messages = fold_inline_system(messages, self.made)
        if self.call_ids == "alnum9":
            messages = fit_call_ids(messages, self.made)
        if data.tools and not self.renders_tools:
            if self.tool_prompt is not None:
                messages = self.tool_prompt.into_system(messages, data.tools)
            elif self.refuse_unrendered_tools:
                raise InvalidRequestError(
                    "this model's chat template does not render tools, and the server refuses requests with tools "
                    "(--unrendered-tools refuse); send the request without tools, or ask the operator to set a "
                    "tool-prompt template (--tool-prompt-template)", param="tools")
        return data if messages is data.messages else replace(data, messages=messages)

    def model_info(self) -> dict[str, Any]:
        """The ``ModelInfo`` fields (GetModel) that carry these forms to the gateway's ``/v1/models``."""
        return {"inline_system": self.inline_system, "inline_system_reason": self.inline_system_reason,
                "tools_unrendered": self.tools_unrendered,
                "tool_prompt": self.tool_prompt.name if self.tool_prompt is not None else ""}

    def summary(self) -> dict[str, Any]:
        """The decisions as the start-up log line (``parse.template_forms``) shows them."""
        return {"inline_system": self.inline_system, "inline_system_reason": self.inline_system_reason,
                "call_ids": self.call_ids, "renders_tools": self.renders_tools,
                "tool_prompt": self.tool_prompt.name if self.tool_prompt is not None else "",
                "tools_unrendered": self.tools_unrendered}

