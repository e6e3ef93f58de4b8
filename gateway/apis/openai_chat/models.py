"""Pydantic models of the OpenAI-compatible request bodies (permissive: unknown fields ignored)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ContentPart(_Loose):
    """One part of a message's content list; only ``text`` parts are supported."""

    type: str
    text: str | None = None


class FunctionCall(_Loose):
    """A function call inside an assistant message's ``tool_calls``."""

    name: str
    arguments: str | dict[str, Any] = ""


class ToolCallIn(_Loose):
    """One entry of an assistant message's ``tool_calls``."""

    id: str = ""
    type: str = "function"
    function: FunctionCall


class ChatMessage(_Loose):
    """One message of the conversation, any role."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None


class FunctionDef(_Loose):
    """A function tool's definition."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDef(_Loose):
    """An entry of ``tools``; only ``function`` tools are supported."""

    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(_Loose):
    """``{"name": ...}`` inside a named tool choice."""

    name: str


class NamedToolChoice(_Loose):
    """``{"type": "function", "function": {"name": ...}}``."""

    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(_Loose):
    """``stream_options`` of a streaming request."""

    include_usage: bool = False


class AgentHintsIn(_Loose):
    """``nvext.agent_hints`` (Dynamo-compatible scheduling hints)."""

    priority: int | None = None
    osl: int | None = None
    speculative_prefill: bool | None = None


class AgentContextIn(_Loose):
    """``nvext.agent_context``: who the request belongs to."""

    session_type_id: str | None = None
    session_id: str | None = None
    trajectory_id: str | None = None
    parent_session_id: str | None = None
    parent_trajectory_id: str | None = None
    session_final: bool | None = None  # the session's last request (Dynamo's X-Dynamo-Session-Final)


class SessionControlIn(_Loose):
    """``nvext.session_control`` (Dynamo): ``action`` ``"close"`` on a session's last turn."""

    session_id: str | None = None
    action: str | None = None


class NvExt(_Loose):
    """Dynamo-style ``nvext`` extension object."""

    agent_hints: AgentHintsIn | None = None
    agent_context: AgentContextIn | None = None
    session_control: SessionControlIn | None = None

    def closes_session(self) -> bool:
        """Whether the client closes its session with this request (its KV blocks go first once it ends)."""
        control, context = self.session_control, self.agent_context
        return bool((control is not None and control.action == "close")
                    or (context is not None and context.session_final))


class ChatCompletionRequest(_Loose):
    """``POST /v1/chat/completions``."""

    model: str = ""
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    continue_final_message: bool = False
    add_generation_prompt: bool = True
    ignore_eos: bool = False
    nvext: NvExt | None = None


class TokenizeChatRequest(_Loose):
    """vLLM's ``POST /tokenize`` with messages: rendered exactly like a chat request."""

    model: str = ""
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[ToolDef] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class TokenizePromptRequest(_Loose):
    """vLLM's ``POST /tokenize`` with a raw prompt."""

    model: str = ""
    prompt: str
    add_special_tokens: bool = True


class DetokenizeRequest(_Loose):
    """vLLM's ``POST /detokenize``."""

    model: str = ""
    tokens: list[Annotated[int, Field(ge=0, lt=2**32)]]
