"""Pydantic models of ``POST /v1/responses`` bodies (permissive: unknown fields are ignored).

Only what the conversion needs is typed. Input items are validated per type in ``convert.py`` so that a
malformed item is a 400 naming it (``input[3].call_id``), and so is an item type this server does not know
(``input[3].type``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.apis.openai_chat.models import NvExt


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")



class ContentPartIn(_Loose):
    """A part of a message's content: ``input_text`` / ``output_text`` (others are rejected)."""

    type: str
    text: str | None = None


class MessageItem(_Loose):
    """``{"type": "message", "role": ..., "content": str | [parts]}`` (``type`` may be omitted)."""

    type: Literal["message"] = "message"
    id: str | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPartIn]
    phase: str | None = None


class FunctionCallItem(_Loose):
    """A function call the model made earlier (replayed by the client)."""

    type: Literal["function_call"]
    id: str | None = None
    call_id: str
    name: str
    arguments: str = ""
    namespace: str | None = None


class FunctionCallOutputItem(_Loose):
    """The result of a function call."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPartIn]


class CustomToolCallItem(_Loose):
    """A freeform (custom) tool call the model made earlier."""

    type: Literal["custom_tool_call"]
    id: str | None = None
    call_id: str
    name: str
    input: str = ""


class CustomToolCallOutputItem(_Loose):
    """The result of a custom tool call."""

    type: Literal["custom_tool_call_output"]
    call_id: str
    output: str | list[ContentPartIn]


class ReasoningText(_Loose):
    """A ``summary_text`` or ``reasoning_text`` entry of a reasoning item."""

    type: str = "summary_text"
    text: str = ""


class ReasoningItem(_Loose):
    """Reasoning the model produced earlier; ``encrypted_content`` is opaque to clients."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None


class CompactionItem(_Loose):
    """A compaction this gateway made earlier: ``encrypted_content`` is its sealed summary."""

    type: Literal["compaction"]
    id: str | None = None
    encrypted_content: str


class FunctionToolDef(_Loose):
    """``{"type": "function", "name", "description", "parameters", "strict"}``."""

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class CustomToolFormat(_Loose):
    """A custom tool's input format: ``text`` or a ``grammar`` (lark / regex)."""

    type: str = "text"
    syntax: str | None = None
    definition: str | None = None


class CustomToolDef(_Loose):
    """A freeform tool (e.g. Codex's ``apply_patch``): the model writes raw text, not JSON."""

    type: Literal["custom"]
    name: str
    description: str | None = None
    format: CustomToolFormat | None = None


class NamespaceToolDef(_Loose):
    """A named group of tools (Codex's ``multi_agent_v1``); members are function or custom tools."""

    type: Literal["namespace"]
    name: str
    description: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)


class ReasoningConfig(_Loose):
    """``reasoning``: effort and summary mode."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed", "none"] | None = None


class TextFormat(_Loose):
    """``text.format``: ``text`` | ``json_object`` | ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(_Loose):
    """``text``: output format and verbosity."""

    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class NamedToolChoiceIn(_Loose):
    """``{"type": "function"|"custom", "name": ...}`` or a built-in tool type (then: auto)."""

    type: str
    name: str | None = None


class ResponsesRequest(_Loose):
    """``POST /v1/responses``."""

    model: str = ""
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoiceIn | None = None
    parallel_tool_calls: bool = True
    reasoning: ReasoningConfig | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    text: TextConfig | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    include: list[str] | None = None
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = None
    user: str | None = None
    nvext: NvExt | None = None
