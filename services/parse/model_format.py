"""The model's format in one object: conversation -> prompt tokens, token stream -> output pipeline."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from services.common.errors import ContextLengthError
from services.common.model_dir import ModelDir
from services.parse.conversation import Conversation, match_text, to_template_input
from services.parse.parsers.pipeline import IncrementalDetokenizer, OutputPipeline
from services.parse.parsers.registry import reasoning_parser_factory, tool_parser_factory
from services.parse.parsers.tool_calls import new_tool_call_id
from services.parse.renderer import ChatTemplateRenderer, Clock


@dataclass(frozen=True)
class Prompt:
    """A rendered and tokenized conversation."""

    text: str
    token_ids: list[int]
    match_text: str


class ModelFormat:
    """Rendering, tokenization and output parsing of one model (built once at start, shared by requests).

    Unknown parser names raise ``UnknownParserError`` here, at construction.
    """

    def __init__(
        self,
        model_dir: ModelDir,
        *,
        served_model_name: str = "",
        max_model_len: int = 0,
        reasoning_parser: str = "",
        tool_parser: str = "",
        strip_billing_header: bool = True,
        now: Clock | None = None,
        new_call_id: Callable[[], str] = new_tool_call_id,
    ) -> None:
        self.model_dir = model_dir
        self.served_model_name = served_model_name or model_dir.name
        self.max_model_len = max_model_len or model_dir.max_model_len
        self.reasoning_parser = reasoning_parser
        self.tool_parser = tool_parser
        self.stop_token_ids = model_dir.eos_token_ids
        self._strip_billing = strip_billing_header
        self._reasoning = reasoning_parser_factory(reasoning_parser) if reasoning_parser else None
        self._tools = tool_parser_factory(tool_parser) if tool_parser else None
        self._new_call_id = new_call_id
        if now is None:
            self.renderer = ChatTemplateRenderer(model_dir.chat_template, model_dir.special_tokens)
        else:
            self.renderer = ChatTemplateRenderer(model_dir.chat_template, model_dir.special_tokens, now)

    def render(self, conversation: Conversation) -> str:
        strip = conversation.strip_billing_header
        return self.renderer.render(
            to_template_input(conversation, strip_billing=self._strip_billing if strip is None else strip))

    def build_prompt(self, conversation: Conversation) -> Prompt:
        """Render and tokenize like ``apply_chat_template(tokenize=True)``: no extra special tokens."""
        text = self.render(conversation)
        return Prompt(text=text, token_ids=self.encode(text), match_text=match_text(conversation))

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return list(self.model_dir.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, token_ids: list[int]) -> str:
        return self.model_dir.tokenizer.decode(token_ids, skip_special_tokens=False)

    def check_fits(self, prompt_tokens: int, max_tokens: int) -> None:
        """Raise ContextLengthError when the prompt plus ``max_tokens`` exceeds the context."""
        if prompt_tokens + max_tokens > self.max_model_len or prompt_tokens >= self.max_model_len:
            raise ContextLengthError(
                f"this model's maximum context length is {self.max_model_len} tokens; the prompt has "
                f"{prompt_tokens} tokens and max_tokens is {max_tokens}",
                param="messages",
            )

    def output_pipeline(self, prompt_text: str) -> OutputPipeline:
        """A fresh pipeline for one stream (the prompt decides whether it starts inside reasoning)."""
        return OutputPipeline(
            IncrementalDetokenizer(self.model_dir.tokenizer, self.stop_token_ids),
            self._reasoning(prompt_text) if self._reasoning else None,
            self._tools(self._new_call_id) if self._tools else None,
        )
