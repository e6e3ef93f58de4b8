"""The canonical conversation (domain types) and its translation into the inputs of a chat template.

The translation copies what Hugging Face callers pass to ``apply_chat_template``: OpenAI-style message
dicts with ``reasoning_content`` and ``tool_calls`` (arguments as a mapping), None-valued keys dropped.
A message's ``content`` is its text parts joined, "" when they are empty, and absent when it has none:
templates tell these apart (Qwen3's and DeepSeek's fail on an assistant turn without content), so the
APIs keep what the client sent (docs/conversation-mapping.md).
Assistant messages also carry ``segments``: their parts in the order the model produced them, which
the demo template replays byte-identically (other templates ignore the key).
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from services.common.errors import InvalidRequestError
from services.parse import json_memo
from services.parse.replay import TRUNCATE_KWARG, ReplayPolicy

BILLING_HEADER = re.compile(r"^x-anthropic-billing-header:.*(?:\n|$)", re.MULTILINE)
_NOISY_ROLES = ("system", "developer", "user")


@dataclass(frozen=True)
class TextPart:
    """Visible text."""

    text: str


@dataclass(frozen=True)
class ReasoningPart:
    """The model's reasoning."""

    text: str


@dataclass(frozen=True)
class ToolCallPart:
    """A tool call the assistant made; ``arguments_json`` exactly as the model wrote it."""

    id: str
    name: str
    arguments_json: str


Part = TextPart | ReasoningPart | ToolCallPart


@dataclass(frozen=True)
class ChatMessage:
    """One message: a role and its ordered parts."""

    role: str
    parts: tuple[Part, ...] = ()
    tool_call_id: str = ""
    name: str = ""
    is_error: bool = False


@dataclass(frozen=True)
class ToolSpec:
    """A tool the model may call; ``parameters_json`` is a JSON Schema as text."""

    name: str
    description: str = ""
    parameters_json: str = ""


@dataclass(frozen=True)
class Conversation:
    """A chat request as far as the prompt is concerned."""

    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    template_kwargs_json: str = ""
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    strip_billing_header: bool | None = None  # per request (the Anthropic API sets it); None: the service default


@dataclass(frozen=True)
class TemplateInput:
    """What a chat template is rendered with: plain JSON data only (dict, list, str, int, float, bool, None),
    which the renderer hands to the template as it is (no defensive copy)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    add_generation_prompt: bool = True
    continue_final_message: bool = False


class MessageDicts:
    """The template dicts of recently rendered messages, by message *identity* (thread-safe, bounded).

    A conversation the parse service holds between turns (``services.common.message_reuse``) hands its next
    render the very same message objects, so their dicts (and the tool-call arguments parsed into them) are
    made once per session rather than once per turn. A dict is shared by every render that gets it: a
    template cannot change it (the immutable sandbox), and the renderer hands it over as it is.
    """

    def __init__(self, max_messages: int = 100_000) -> None:
        """At most ``max_messages`` dicts; past it the least recently made go first."""
        self._max = max_messages
        self._items: OrderedDict[int, tuple[ChatMessage, tuple[Any, ...], dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, message: ChatMessage, how: tuple[Any, ...]) -> dict[str, Any] | None:
        """``message``'s dict made the same ``how`` (replay, billing, arguments), or None."""
        item = self._items.get(id(message))
        if item is None or item[0] is not message or item[1] != how:
            return None
        return item[2]

    def put(self, message: ChatMessage, how: tuple[Any, ...], made: dict[str, Any]) -> None:
        """Keep ``made``; its tool calls' argument mappings are registered with :data:`json_memo.MEMO` while it
        is kept, so a template's ``arguments | tojson`` encodes each once per session, not once per turn."""
        with self._lock:  # the entry keeps the message alive, so its id names no other object meanwhile
            replaced = self._items.get(id(message))
            self._items[id(message)] = (message, how, made)
            self._items.move_to_end(id(message))
            for arguments in _argument_mappings(made):
                json_memo.MEMO.register(arguments)
            gone = [replaced[2]] if replaced is not None else []
            while len(self._items) > self._max:
                gone.append(self._items.popitem(last=False)[1][2])
            for old in gone:
                for arguments in _argument_mappings(old):
                    json_memo.MEMO.forget(arguments)


def _argument_mappings(made: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool-call argument mappings of a message dict, in its ``tool_calls`` and its ordered ``segments``
    (none when the arguments are handed over as text)."""
    found = [c["function"]["arguments"] for c in made.get("tool_calls") or ()]
    found += [seg["arguments"] for seg in made.get("segments") or () if seg["type"] == "tool_call"]
    return [arguments for arguments in found if isinstance(arguments, dict)]


class ToolDicts:
    """Template dicts and parameter schemas of recently seen tool lists, by content (thread-safe, bounded).

    A harness sends the same tools every turn; their JSON Schemas (32-62 KB for Claude Code) are parsed
    once per list, not twice per turn, and the dicts (shared by every render that gets them, like
    :class:`MessageDicts`') are registered with :data:`services.parse.json_memo.MEMO`, so a template's
    ``tool | tojson`` encodes each once too. A list with a bad tool is never kept (its error is raised).
    """

    def __init__(self, max_lists: int = 64) -> None:
        self._max = max_lists
        self._lists: OrderedDict[tuple[ToolSpec, ...], tuple[list[dict[str, Any]], dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def dicts(self, tools: tuple[ToolSpec, ...]) -> list[dict[str, Any]]:
        """The tools' template dicts (as ``to_template_input`` makes them)."""
        return self._entry(tools)[0]

    def schemas(self, tools: tuple[ToolSpec, ...]) -> dict[str, Any]:
        """Tool name -> parameters JSON Schema, for the tools whose schema is a JSON object."""
        return self._entry(tools)[1]

    def _entry(self, tools: tuple[ToolSpec, ...]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        if not tools:
            return [], {}
        entry = self._lists.get(tools)
        if entry is not None:
            return entry
        made = [_tool_dict(i, t) for i, t in enumerate(tools)]
        # as _tool_dict parsed it; no parameters: {} (the template gets the empty-object schema instead)
        schemas = {t.name: d["function"]["parameters"] if t.parameters_json.strip() else {}
                   for t, d in zip(tools, made, strict=True) if isinstance(d["function"]["parameters"], dict)}
        with self._lock:
            entry = self._lists.setdefault(tools, (made, schemas))
            if entry[0] is made:
                for d in made:
                    json_memo.MEMO.register(d)
            while len(self._lists) > self._max:
                for d in self._lists.popitem(last=False)[1][0]:
                    json_memo.MEMO.forget(d)
        return entry


def strip_billing_header(text: str) -> str:
    """Drop Claude Code's per-session ``x-anthropic-billing-header:`` lines (they break prefix caching)."""
    return BILLING_HEADER.sub("", text) if "x-anthropic-billing-header:" in text else text


def to_template_input(
    conversation: Conversation,
    *,
    strip_billing: bool = True,
    arguments_as_text: bool = False,
    replay: ReplayPolicy = ReplayPolicy(),  # noqa: B008 - frozen, shared default
    memo: MessageDicts | None = None,
    tool_memo: ToolDicts | None = None,
) -> TemplateInput:
    """Translate ``conversation`` into chat-template inputs; bad JSON raises InvalidRequestError naming the field.

    ``arguments_as_text`` hands tool-call arguments over as the JSON text the model wrote (DeepSeek's
    templates concatenate them) instead of a mapping; ``replay`` says what happens to reasoning. ``memo``
    keeps each message's dict for the next render of the same message object (see :class:`MessageDicts`),
    ``tool_memo`` the tool list's dicts for its next render (see :class:`ToolDicts`).
    """
    if not conversation.messages:
        raise InvalidRequestError("messages must not be empty", param="messages")
    kwargs: dict[str, Any] = {}
    if conversation.template_kwargs_json.strip():
        parsed = _parse_json(conversation.template_kwargs_json, "chat_template_kwargs_json")
        if not isinstance(parsed, dict):
            raise InvalidRequestError("chat_template_kwargs_json must be a JSON object",
                                      param="chat_template_kwargs_json")
        kwargs = parsed
    truncate = replay.truncate(kwargs)
    if replay.keep_history and TRUNCATE_KWARG not in kwargs:
        kwargs[TRUNCATE_KWARG] = False
    last_user = max((i for i, m in enumerate(conversation.messages) if m.role == "user"), default=-1)
    messages = []
    for i, m in enumerate(conversation.messages):
        how = (truncate and i < last_user, strip_billing and m.role in _NOISY_ROLES, arguments_as_text, replay)
        made = memo.get(m, how) if memo is not None else None
        if made is None:
            made = _message_dict(_replayed(m, replay, drop_reasoning=how[0]), strip_billing=how[1],
                                 arguments_as_text=arguments_as_text)
            if memo is not None:
                memo.put(m, how, made)
        messages.append(made)
    if tool_memo is not None:
        tools = tool_memo.dicts(conversation.tools) or None
    else:
        tools = [_tool_dict(i, t) for i, t in enumerate(conversation.tools)] or None
    return TemplateInput(
        messages=messages,
        tools=tools,
        kwargs=kwargs,
        add_generation_prompt=conversation.add_generation_prompt and not conversation.continue_final_message,
        continue_final_message=conversation.continue_final_message,
    )


MATCH_SEPARATOR = "\x1e"  # between messages in ``match_text``: no script ``match`` spans two of them


def match_text(conversation: Conversation) -> str:
    """Text of every user and tool message since the last assistant message (simulated engines pick a
    script by it), in order, joined by ``MATCH_SEPARATOR``.

    All of them, not only the last: a harness may append its own user message after the tool results
    (OpenClaw's runtime context), and matching that alone would replay the same turn forever. Trailing
    assistant messages (a prefill) are skipped first.
    """
    texts: list[str] = []
    for message in reversed(conversation.messages):
        if message.role in ("user", "tool"):
            texts.append("".join(p.text for p in message.parts if isinstance(p, TextPart)))
        elif message.role == "assistant" and texts:
            break
    return MATCH_SEPARATOR.join(reversed(texts))


def _replayed(message: ChatMessage, replay: ReplayPolicy, *, drop_reasoning: bool) -> ChatMessage:
    """``message`` with its reasoning as the policy wants it (``pass`` leaves it to the template)."""
    if message.role != "assistant" or replay.mode == "pass":
        return message
    if not any(isinstance(p, ReasoningPart) for p in message.parts):
        return message
    parts: list[Part] = []
    for part in message.parts:
        if not isinstance(part, ReasoningPart):
            parts.append(part)
        elif replay.mode == "reinsert" and not drop_reasoning:
            parts.append(TextPart(replay.open + part.text + replay.close))
    return ChatMessage(message.role, tuple(parts), message.tool_call_id, message.name, message.is_error)


def _message_dict(message: ChatMessage, *, strip_billing: bool, arguments_as_text: bool = False) -> dict[str, Any]:
    texts = [p.text for p in message.parts if isinstance(p, TextPart)]
    if strip_billing:
        stripped = [strip_billing_header(t) for t in texts]
        texts = [s for s, t in zip(stripped, texts, strict=True) if s or not t] or ([""] if texts else [])
    reasoning = [p.text for p in message.parts if isinstance(p, ReasoningPart)]
    calls = [p for p in message.parts if isinstance(p, ToolCallPart)]
    out: dict[str, Any] = {
        "role": message.role,
        "content": "".join(texts) if texts else None,
        "reasoning_content": "\n".join(reasoning) if reasoning else None,
    }
    if calls:
        out["tool_calls"] = [
            _drop_none({
                "id": c.id or None,
                "type": "function",
                "function": {
                    "name": c.name,
                    "arguments": (c.arguments_json or "{}") if arguments_as_text else _arguments(c.arguments_json),
                },
            })
            for c in calls
        ]
    if message.role == "tool":
        out["tool_call_id"] = message.tool_call_id or None
        out["name"] = message.name or None
    if message.role == "assistant" and message.parts:
        # An empty text part says "content was sent" (templates read content ""); it is no segment.
        out["segments"] = [_segment(p) for p in message.parts if not isinstance(p, TextPart) or p.text]
    return _drop_none(out)


def _segment(part: Part) -> dict[str, Any]:
    if isinstance(part, ReasoningPart):
        return {"type": "reasoning", "text": part.text}
    if isinstance(part, ToolCallPart):
        return {"type": "tool_call", "name": part.name, "arguments": _arguments(part.arguments_json)}
    return {"type": "text", "text": part.text}


def _arguments(arguments_json: str) -> Any:
    """Arguments as a mapping when they parse to one (templates expect that), else the text unchanged."""
    if not arguments_json.strip():
        return {}
    try:
        parsed = json.loads(arguments_json)
    except json.JSONDecodeError:
        return arguments_json
    return parsed if isinstance(parsed, dict) else arguments_json


def _tool_dict(index: int, tool: ToolSpec) -> dict[str, Any]:
    if not tool.name:
        raise InvalidRequestError("a tool needs a name", param=f"tools[{index}].name")
    parameters: Any = {"type": "object", "properties": {}}
    if tool.parameters_json.strip():
        parameters = _parse_json(tool.parameters_json, f"tools[{index}].parameters_json")
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": parameters},
    }


def _parse_json(text: str, param: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"{param} is not valid JSON: {exc}", param=param) from exc


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}
