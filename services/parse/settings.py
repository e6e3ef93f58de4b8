"""Settings of the parse service (light to import: the launcher reads them)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from services.common.service_settings import DEFAULT_MAX_MESSAGES, MeshServiceSettings
from services.common.settings import option
from services.parse.limits import RequestLimits
from services.parse.parsers.registry import REASONING_PARSERS, TOOL_PARSERS
from services.parse.replay import REPLAY_CHOICES
from services.parse.template_catalog import INLINE_SYSTEM_CHOICES, UNRENDERED_TOOLS_CHOICES, TemplatePolicy

NO_PARSER = "none"  # a parser flag's value that turns off the parser a model directory names


def chosen_parser(flag: str, model_default: str) -> str:
    """The parser in effect: the flag's, else the model directory's; ``none`` is no parser ("")."""
    if flag == NO_PARSER:
        return ""
    return flag or model_default


@dataclass(frozen=True)
class ParseSettings(MeshServiceSettings):
    """Options of ``python -m services.parse``."""

    host: str = option("127.0.0.1", "Address the Parse gRPC server binds.", wiring=True)
    port: int = option(0, "Port of the Parse gRPC server (0: a free port).", wiring=True)
    router_address: str = option(
        "127.0.0.1:50052", "host:port of the router's gRPC service; several replicas comma-separated, and "
        "dns:///name:port for one replica per address a DNS name resolves to. Streams spread over the replicas: a "
        "session's turns by its key (they keep one router while it is up), others round robin.", wiring=True)
    router_dns_refresh: float = option(
        30.0, "Seconds between two resolutions of the dns:/// router names (also resolved at once when every router "
        "is down); 0: only then.")
    model: str = option("", "Hugging Face model directory (empty: the repo's demo model).", shared=True)
    served_model_name: str = option(
        "", "Model name reported to clients (empty: the model directory's harnessmesh.json names it, else the "
        "directory's name).", shared=True)
    reasoning_parser: str = option(
        "", "Reasoning parser of the model's output (empty: the one the model directory's harnessmesh.json names, "
        "if any; none: no parser).", shared=True, choices=("", NO_PARSER, *REASONING_PARSERS))
    tool_parser: str = option(
        "", "Tool-call parser of the model's output (empty: the one the model directory's harnessmesh.json names, "
        "if any; none: no parser).", shared=True, choices=("", NO_PARSER, *TOOL_PARSERS))
    max_model_len: int = option(0, "Context length in tokens (0: from the model's config); the parse service "
                                "and the workers both use it.", shared=True)
    router_retry: float = option(
        5.0, "Seconds to keep retrying a router stream that fails unavailable before its first token (a "
        "router restarting); 0: fail at once.")
    strip_billing_header: bool = option(
        True, "Drop Claude Code's per-session 'x-anthropic-billing-header:' lines so prompts keep a stable prefix.")
    prefix_watch_store: str = option(
        "memory", "Where each session's prefix-watch histories live: this process's memory, or also a NATS JetStream "
        "KV bucket every parse replica shares, so a session's turns may land on any replica (docs/state.md).",
        choices=("memory", "jetstream"))
    prefix_watch_bucket: str = option(
        "", "jetstream prefix watch: the KV bucket (empty: harnessmesh_<namespace>_prefix_watch).")
    prefix_watch_ttl: float = option(
        21600.0, "jetstream prefix watch: seconds a session's histories are kept after its last turn.")
    prefix_watch_max_bytes: int = option(
        1 << 30, "jetstream prefix watch: the bucket's size cap in bytes (oldest sessions dropped past it; -1: none).")
    prefix_watch_replicas: int = option(
        1, "jetstream prefix watch: copies of the bucket in a JetStream cluster (3 for a 3-node cluster).")
    nats_url: str = option("nats://127.0.0.1:4222", "NATS server (used only by --prefix-watch-store jetstream).",
                           shared=True)
    nats_token: str = option("", "Token the NATS server requires (HARNESSMESH_NATS_TOKEN).", shared=True, secret=True)

    reasoning_replay: str = option(
        "auto", "How earlier turns' reasoning is replayed: pass (as reasoning_content), reinsert (in the model's "
        "markers), drop; auto: pass when the chat template reads reasoning, else drop.", choices=REPLAY_CHOICES)
    max_messages: int = option(
        DEFAULT_MAX_MESSAGES, "Most messages one request may carry (0: no limit); more is a 400.")
    max_tools: int = option(1_000, "Most tools one request may declare (0: no limit); more is a 400.")
    max_message_parts: int = option(1_000, "Most parts (texts, reasoning, tool calls) per message (0: no limit).")
    max_text_chars: int = option(
        4_000_000, "Most characters in one text, reasoning, tool-call arguments or tool schema (0: no limit).")
    render_budget_ms: int = option(
        1000, "Most milliseconds one chat-template render may take; past it the request gets a 400 naming this "
        "budget (a render holds the GIL: this bounds how long one conversation can slow the service). 0: none.")
    inline_system: str = option(
        "auto", "How system messages inside the conversation (not the leading one) reach the chat template: as-is; "
        "user (as <system-reminder> text joined to the neighbouring user or tool message); auto: user when a start-up "
        "probe shows the template hoists, drops or refuses them, else as-is. The model catalog's inline_system key "
        "wins (docs/conversation-mapping.md).", choices=INLINE_SYSTEM_CHOICES)
    tool_prompt_template: str = option(
        "", "For a chat template that does not render tools: a tool-prompt template (built-in deepseek-r1, "
        "deepseek-v3.1, or a Jinja file) that puts them in the system message (empty: none). The catalog's "
        "tool_prompt_template key wins.", metavar="NAME|FILE")
    unrendered_tools: str = option(
        "warn", "A request with tools for a chat template that does not render them (and no tool prompt): warn "
        "(served, marked by a response header and span attribute) or refuse (400). The catalog's unrendered_tools "
        "key wins.", choices=UNRENDERED_TOOLS_CHOICES)
    model_catalog: str = option(
        "", "Model catalog file (YAML or JSON): per-model metadata served by /v1/models (see gateway/catalog.py); "
        "the parse service reads its inline_system, tool_prompt_template and unrendered_tools keys.", shared=True,
        metavar="FILE")
    template_now: str = option(
        "", "Pin the chat template clock (strftime_now) to this ISO time, e.g. 2026-01-15T09:30:00 "
        "(empty: the real clock). A prompt that changes at midnight is a prefix-cache miss.", metavar="ISO")

    def template_clock(self) -> datetime | None:
        """The pinned template time, or None for the real clock."""
        return datetime.fromisoformat(self.template_now) if self.template_now else None

    def template_policy(self) -> TemplatePolicy:
        """The template options as flags set them (the catalog is applied once the served name is known)."""
        return TemplatePolicy(self.inline_system, self.tool_prompt_template, self.unrendered_tools)

    def request_limits(self) -> RequestLimits:
        """The shape limits every request is checked against (``limits.py``)."""
        return RequestLimits(self.max_messages, self.max_tools, self.max_message_parts, self.max_text_chars)

    def router_addresses(self) -> list[str]:
        """The ``--router-address`` entries (``host:port`` or ``dns:///name:port``)."""
        return [address.strip() for address in self.router_address.split(",") if address.strip()]

    def validate(self) -> None:
        super().validate()
        if self.template_now:
            try:
                self.template_clock()
            except ValueError:
                raise ValueError(f"template_now {self.template_now!r} is not an ISO time") from None
        if self.prefix_watch_store == "jetstream" and not self.nats_url:
            raise ValueError("prefix_watch_store jetstream needs nats_url")
        if self.prefix_watch_ttl <= 0 or self.prefix_watch_replicas < 1:
            raise ValueError("prefix_watch_ttl must be positive and prefix_watch_replicas at least 1")
        if self.router_retry < 0:
            raise ValueError("router_retry must not be negative")
        if not self.router_addresses():
            raise ValueError("router_address names no router")
        from services.parse.router_pool import RouterTarget  # grpc and the mux: only once settings are used

        for entry in self.router_addresses():
            RouterTarget.parse(entry)
        if self.router_dns_refresh < 0:
            raise ValueError("router_dns_refresh must not be negative")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is out of range")
        if self.max_model_len < 0:
            raise ValueError("max_model_len must be >= 0")
        if self.render_budget_ms < 0:
            raise ValueError("render_budget_ms must be >= 0")
        for name in ("max_messages", "max_tools", "max_message_parts", "max_text_chars"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0")
        if self.reasoning_parser not in ("", NO_PARSER, *REASONING_PARSERS):
            raise ValueError(f"unknown reasoning parser {self.reasoning_parser!r}; valid: {sorted(REASONING_PARSERS)}")
        if self.tool_parser not in ("", NO_PARSER, *TOOL_PARSERS):
            raise ValueError(f"unknown tool parser {self.tool_parser!r}; valid: {sorted(TOOL_PARSERS)}")
