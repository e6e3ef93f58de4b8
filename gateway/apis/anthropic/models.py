"""Pydantic models of Anthropic Messages API request bodies (permissive: unknown fields are ignored).

Content blocks are one discriminated union on ``type``, so a malformed block is reported at its own
path (``messages.1.content.0.tool_use_id``). Block types this gateway does not know are kept as
:class:`UnknownBlock` and rejected by the converter with a message naming the type.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextBlock(_Loose):
    """``{"type": "text", "text": ...}`` (``cache_control`` and ``citations`` are accepted and ignored)."""

    type: Literal["text"]
    text: str


class ImageBlock(_Loose):
    """An image; accepted by the schema so that the converter can answer with a clear 400."""

    type: Literal["image", "document"]
    source: dict[str, Any] | None = None


class ThinkingBlock(_Loose):
    """Reasoning the assistant produced, replayed by the client with the signature we streamed."""

    type: Literal["thinking"]
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(_Loose):
    """Encrypted reasoning from another provider: accepted, never rendered (there is nothing to read)."""

    type: Literal["redacted_thinking"]
    data: str = ""


class ToolUseBlock(_Loose):
    """A tool call the assistant made."""

    type: Literal["tool_use", "server_tool_use"]
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(_Loose):
    """The result of a tool call, in a user message."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock] | None = None
    is_error: bool = False


class UnknownBlock(_Loose):
    """A block type this gateway does not know (rejected with a 400 naming it)."""

    type: str


def _block_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    # A type that is not a string (``{"type": {}}``) is unhashable: "unknown", whose ``type: str`` names it.
    return kind if isinstance(kind, str) and kind in _KNOWN else "unknown"


_KNOWN = {"text", "image", "document", "thinking", "redacted_thinking", "tool_use", "server_tool_use", "tool_result"}

ContentBlock = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ImageBlock, Tag("image")]
    | Annotated[ImageBlock, Tag("document")]
    | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[RedactedThinkingBlock, Tag("redacted_thinking")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolUseBlock, Tag("server_tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[UnknownBlock, Tag("unknown")],
    Discriminator(_block_tag),
]


class Message(_Loose):
    """One message. ``system`` inside ``messages`` is what Claude Code sends for non-Claude models."""

    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class Tool(_Loose):
    """A client tool (``input_schema``); server tools (``type`` like ``web_search_20250305``) are dropped."""

    name: str
    type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    defer_loading: bool = False


class ToolChoice(_Loose):
    """``auto`` | ``any`` | ``tool`` (with ``name``) | ``none``."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(_Loose):
    """``enabled`` (with ``budget_tokens``), ``adaptive`` or ``disabled``; ``display`` is accepted."""

    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: int | None = Field(default=None, ge=0)
    display: str | None = None


class OutputConfig(_Loose):
    """``output_config``: the effort the model should spend."""

    effort: Literal["low", "medium", "high", "max", "xhigh"] | None = None


class KeepTurns(_Loose):
    """``{"type": "thinking_turns", "value": N}``."""

    type: str
    value: int = Field(ge=0)


class ContextEdit(_Loose):
    """One ``context_management.edits`` entry; only ``clear_thinking_*`` changes what is rendered."""

    type: str
    keep: Literal["all"] | KeepTurns | None = None


class ContextManagement(_Loose):
    """``context_management``."""

    edits: list[ContextEdit] = Field(default_factory=list)


class Metadata(_Loose):
    """``metadata``; Claude Code sends ``user_id`` as a JSON string holding ``session_id``."""

    user_id: str | None = None


class CountTokensRequest(_Loose):
    """``POST /v1/messages/count_tokens``: everything that shapes the prompt."""

    model: str = ""
    messages: list[Message]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    context_management: ContextManagement | None = None
    metadata: Metadata | None = None


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``."""

    model: str
    max_tokens: int = Field(ge=1)
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
