"""The model's format in one object: conversation -> prompt tokens, token stream -> output pipeline."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from services.common.errors import ContextLengthError
from services.common.model_dir import ModelDir
from services.parse.conversation import (
    Conversation,
    MessageDicts,
    TemplateInput,
    ToolDicts,
    match_text,
    to_template_input,
)
from services.parse.parsers.pipeline import IncrementalDetokenizer, MarkerIds, OutputPipeline, carried_call_ids
from services.parse.parsers.registry import (
    REASONING_MARKERS,
    TOOL_MARKERS,
    reasoning_parser_factory,
    replay_markers,
    tool_parser_factory,
)
from services.parse.parsers.tool_core import ParserContext, new_tool_call_id
from services.parse.prompt_cache import Build, PromptCache, Reason, Reuse, boundary_tokens
from services.parse.renderer import ChatTemplateRenderer, Clock
from services.parse.replay import ReplayPolicy
from services.parse.template_forms import TemplateForms, new_alnum9_id
from services.parse.template_probe import decide_forms
from services.parse.tool_prompts import ToolPrompt


@dataclass(frozen=True)
class Prompt:
    """A rendered and tokenized conversation. ``token_ids`` may be shared with the session's prompt cache:
    never mutate it."""

    text: str
    token_ids: Sequence[int]  # an array('I') or a list
    match_text: str
    schemas: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    build: Build = "full"  # how the ids were obtained (see prompt_cache.py)
    build_reason: Reason = "anonymous"
    reused_tokens: int = 0  # ids reused from the session's previous turn


# An anonymous prompt this long is worth caching, keyed by its opening characters (system prompt, first turn).
CONTENT_KEY_CHARS = 16_384


def content_key(text: str) -> str:
    """The prompt cache's key for an anonymous prompt: a digest of its opening; "" (not cached) when short."""
    if len(text) < CONTENT_KEY_CHARS:
        return ""
    return f"c:{xxhash.xxh3_64_hexdigest(text[:CONTENT_KEY_CHARS].encode())}"


class ModelFormat:
    """Rendering, tokenization and output parsing of one model (built once at start, shared by requests).

    Unknown parser names raise ``UnknownParserError`` here, at construction. ``reasoning_replay`` is
    the replay policy (see ``replay.py``); with a reasoning parser, history reasoning is kept by default.
    ``prompt_cache`` tokenizes each session's prompt incrementally (default: one over the model's
    encoder and boundary tokens, see ``prompt_cache.py``). ``forms`` (default: decided here by probing the
    template, ``template_probe.py``, with ``inline_system``, ``tool_prompt`` and ``refuse_unrendered_tools``) is
    what the template is handed instead of the conversation as sent (``template_forms.py``); new tool-call ids
    take the form the template requires unless ``new_call_id`` is given.
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
        reasoning_replay: str = "auto",
        now: Clock | None = None,
        new_call_id: Callable[[], str] | None = None,
        prompt_cache: PromptCache | None = None,
        render_budget: float | None = None,
        forms: TemplateForms | None = None,
        inline_system: str = "auto",
        tool_prompt: ToolPrompt | None = None,
        refuse_unrendered_tools: bool = False,
        inline_system_source: str = "--inline-system",
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
        self.markers = MarkerIds(
            model_dir.tokenizer, (*REASONING_MARKERS.get(reasoning_parser, ()), *TOOL_MARKERS.get(tool_parser, ()))
        )
        if now is None:
            self.renderer = ChatTemplateRenderer(model_dir.chat_template, model_dir.special_tokens,
                                                 budget=render_budget)
        else:
            self.renderer = ChatTemplateRenderer(model_dir.chat_template, model_dir.special_tokens, now,
                                                 budget=render_budget)
        self.replay = ReplayPolicy.for_template(
            model_dir.chat_template, reasoning_replay,
            markers=replay_markers(reasoning_parser), keep_history=bool(reasoning_parser),
        )
        encoder = model_dir.encoder
        self.prompt_cache = prompt_cache or PromptCache(
            encoder.encode, boundary_tokens(model_dir.tokenizer, encoder.encode))
        self.message_dicts = MessageDicts()  # a held conversation's messages are turned into dicts once
        self.tool_dicts = ToolDicts()  # and a tool list's schemas parsed (and encoded by tojson) once
        self.forms = forms or decide_forms(
            model_dir.chat_template, self.renderer.render, self._template_input, inline_system=inline_system,
            tool_prompt=tool_prompt, refuse_unrendered_tools=refuse_unrendered_tools, source=inline_system_source)
        if new_call_id is None:
            new_call_id = new_alnum9_id if self.forms.call_ids == "alnum9" else new_tool_call_id
        self._new_call_id = new_call_id

    def render(self, conversation: Conversation) -> str:
        return self.renderer.render(self.forms.apply(self._template_input(conversation)))

    def _template_input(self, conversation: Conversation) -> TemplateInput:
        strip = conversation.strip_billing_header
        return to_template_input(
            conversation, strip_billing=self._strip_billing if strip is None else strip,
            arguments_as_text=self.renderer.arguments_as_text, replay=self.replay, memo=self.message_dicts,
            tool_memo=self.tool_dicts,
        )

    def build_prompt(self, conversation: Conversation, *, session: str = "") -> Prompt:
        """Render and tokenize like ``apply_chat_template(tokenize=True)``: no extra special tokens.

        ``session`` (``prefix_watch.session_key``; empty: anonymous) lets the prompt cache reuse the
        session's previous turn's ids up to where the new render diverges; the ids are the same either way.
        A long anonymous prompt is keyed by its opening text (:func:`content_key`), so a client that sends
        no session id still has its conversation's turns find each other.
        """
        return self.tokenize_prompt(conversation, self.token_reuse(self.render(conversation), session=session))

    def tokenize_prompt(self, conversation: Conversation, reuse: Reuse) -> Prompt:
        """:meth:`build_prompt` of ``conversation`` rendered already, as :meth:`token_reuse` of its text decided."""
        encoded = self.prompt_cache.encode_reusing(reuse)
        return Prompt(text=reuse.text, token_ids=encoded.token_ids, match_text=match_text(conversation),
                      schemas=self.tool_dicts.schemas(conversation.tools), build=encoded.build,
                      build_reason=encoded.reason, reused_tokens=encoded.reused_tokens)

    def token_reuse(self, text: str, *, session: str = "") -> Reuse:
        """What :meth:`tokenize_prompt` of the rendered ``text`` will reuse of the session's previous prompt's ids;
        its ``new_chars`` are the characters left to tokenize."""
        return self.prompt_cache.reuse(session or content_key(text), text)

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        if add_special_tokens:
            return list(self.model_dir.tokenizer.encode(text, add_special_tokens=True).ids)
        return self.model_dir.encoder.encode(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.model_dir.tokenizer.decode(list(token_ids), skip_special_tokens=False)

    def fit_max_tokens(self, prompt_tokens: int, max_tokens: int) -> int:
        """``max_tokens`` reduced to the room the context leaves after the prompt (0 stays 0: engine default).

        ``max_tokens`` is a cap, as harnesses use it (Claude Code asks for 32,000 whatever the model):
        a prompt that fits is served, ending with finish reason ``length`` if it reaches the context's
        end. Only a prompt that leaves no room for one output token is a ContextLengthError.
        """
        if prompt_tokens >= self.max_model_len:
            raise ContextLengthError(
                f"prompt is too long: {prompt_tokens} tokens, and this model's maximum context length is "
                f"{self.max_model_len} tokens",
                param="messages",
            )
        room = self.max_model_len - prompt_tokens
        return min(max_tokens, room) if max_tokens > 0 else 0

    def output_pipeline(
        self, prompt_text: str, schemas: Mapping[str, Mapping[str, Any]] | None = None,
        call_ids: Sequence[str] = (),
    ) -> OutputPipeline:
        """A fresh pipeline for one stream (the prompt decides whether it starts inside reasoning); its first
        tool calls get ``call_ids`` (a resumed stream's calls already sent), later ones new ids."""
        new_id = carried_call_ids(call_ids, self._new_call_id) if call_ids else self._new_call_id
        ctx = ParserContext(prompt_text, new_id, schemas or {}, self.markers.marker)
        return OutputPipeline(
            IncrementalDetokenizer(self.model_dir.tokenizer, self.stop_token_ids, self.markers),
            self._reasoning(ctx) if self._reasoning else None,
            self._tools(ctx) if self._tools else None,
            self.markers,
        )
