"""Settings of the gateway process (``python -m gateway``)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.model_aliases import ModelAliases
from services.common.service_settings import DEFAULT_MAX_MESSAGES, CommonSettings
from services.common.settings import option


@dataclass(frozen=True)
class GatewaySettings(CommonSettings):
    """HTTP and gRPC edge of the mesh: OpenAI-compatible API plus the AgentService gRPC API."""

    host: str = option("127.0.0.1", "Interface the HTTP and gRPC edges listen on.")
    http_port: int = option(8000, "HTTP port of the OpenAI-compatible API (0: pick a free port).")
    grpc_port: int = option(8001, "gRPC port of the AgentService edge API (0: pick a free port).")
    parse_address: str = option("127.0.0.1:50051", "host:port of the parse service.", wiring=True)
    served_model_name: str = option(
        "", "Model name clients use (empty: whatever the parse service reports).", shared=True
    )
    api_key: list[str] = option(  # noqa: RUF009 - option() builds a default_factory
        [], "Accepted API key (Authorization: Bearer KEY or x-api-key). None given: no auth.",
        metavar="KEY",
        secret=True,
    )
    enable_streaming_tool_dispatch: bool = option(
        False, "Chat completions streams also send each tool call, the moment its arguments are complete, as "
        "an 'event: tool_call_dispatch' SSE event (its data a valid chunk with empty choices).")
    request_timeout: float = option(600.0, "Deadline in seconds of one request to the parse service.")
    max_concurrent_requests: int = option(
        0, "Chat turns served at once (0: no limit; `harnessmesh up` sets workers x max-num-seqs). Beyond "
        "it turns wait (see --max-queued-requests) or are refused: 429 / 529 / RESOURCE_EXHAUSTED with retry-after.")
    max_queued_requests: int = option(
        -1, "Chat turns that may wait for a slot, highest priority first (-1: as many as --max-concurrent-requests).")
    max_queue_wait: float = option(10.0, "Seconds a turn may wait for a slot before it is refused.")
    max_queue_wait_ttfts: float = option(
        2.0, "A turn waits for a slot only while its estimated wait is at most this many typical TTFTs (the median, "
        "slot to first token, of the last 64 turns); beyond it is refused at once, so an admitted turn's first token "
        "comes within about 1 + this many TTFTs under overload (0: only --max-queue-wait bounds the wait).")
    max_request_bytes: int = option(
        32 << 20, "Largest request body accepted (bytes); a larger one gets 413 before it is read past the limit.")
    max_messages: int = option(
        DEFAULT_MAX_MESSAGES,
        "Most messages (Responses API: input items) one request may carry (0: no limit); more is a 400 "
        "before the body is validated or converted. harnessmesh up gives the parse service the same limit.")
    enable_anthropic_api: bool = option(
        True, "Serve the Anthropic Messages API (POST /v1/messages, POST /v1/messages/count_tokens).")
    strip_anthropic_preamble: bool = option(
        True, "Anthropic API: drop Claude Code's per-session 'x-anthropic-billing-header:' system line before "
        "tokenization (count_tokens too), so prompts keep a cacheable prefix.")
    model_alias: list[str] = option(  # noqa: RUF009 - option() builds a default_factory
        [], "Another model name clients may ask for, served by this mesh's model (repeatable). NAME may be a "
        "glob pattern ('claude-*=demo'): exact names first, then the first pattern that matches, in the order "
        "given. Clients see the name they asked for; /v1/models lists the aliases.",
        metavar="NAME=SERVED",
    )
    thinking_signature_key: str = option(
        "", "Key signing the Anthropic API's thinking blocks and sealing the Responses API's compaction items; "
        "give every gateway replica the same (empty: a random key per process, so a compaction item "
        "dies with the process).", secret=True)
    model_catalog: str = option(
        "", "Model catalog file (YAML or JSON): per-model metadata served by /v1/models (see gateway/catalog.py); "
        "the parse service reads its inline_system, tool_prompt_template and unrendered_tools keys.", shared=True,
        metavar="FILE",
    )
    responses_store: str = option(
        "memory", "Where responses are kept for previous_response_id and GET/DELETE /v1/responses/{id}: this "
        "process's memory, or a NATS JetStream KV bucket every gateway replica shares (docs/state.md).",
        choices=("memory", "jetstream"))
    responses_store_size: int = option(
        1024, "memory store: responses kept for previous_response_id (least recently used dropped; 0: none).")
    responses_store_ttl: float = option(
        3600.0, "Seconds a stored response is kept: after its last use (memory), after it was stored (jetstream).")
    responses_store_bucket: str = option(
        "", "jetstream store: the KV bucket (empty: harnessmesh_<namespace>_responses).")
    responses_store_max_bytes: int = option(
        1 << 30, "jetstream store: the bucket's size cap in bytes (oldest responses dropped past it; -1: none).")
    responses_store_replicas: int = option(
        1, "jetstream store: copies of the bucket in a JetStream cluster (3 for a 3-node cluster).")
    turn_links_store: str = option(
        "memory", "Where each trajectory's previous-turn span link and dispatched tool calls (execute_tool spans) "
        "live: this process's memory, or a NATS JetStream KV bucket every gateway replica shares (docs/state.md).",
        choices=("memory", "jetstream"))
    turn_links_bucket: str = option(
        "", "jetstream turn links: the KV bucket (empty: harnessmesh_<namespace>_turn_links).")
    turn_links_ttl: float = option(
        21600.0, "jetstream turn links: seconds a trajectory's links are kept after its last turn.")
    turn_links_max_bytes: int = option(
        256 << 20, "jetstream turn links: the bucket's size cap in bytes (oldest trajectories dropped past it; "
        "-1: none).")
    turn_links_replicas: int = option(
        1, "jetstream turn links: copies of the bucket in a JetStream cluster (3 for a 3-node cluster).")
    nats_url: str = option("nats://127.0.0.1:4222", "NATS server (used only by the jetstream stores).",
                           shared=True)
    nats_token: str = option("", "Token the NATS server requires (HARNESSMESH_NATS_TOKEN).", shared=True, secret=True)
    trace_records: str = option(
        "", "Write one JSON line per request (timing, tokens, cached tokens, worker, tool-call ids and names; never "
        "prompt text or arguments) to FILE; a .gz name writes gzip. Empty: off. See gateway/trace_records.py.",
        metavar="FILE")

    def model_aliases(self) -> ModelAliases:
        """``--model-alias NAME=SERVED`` entries, patterns compiled; a malformed entry raises ValueError."""
        return ModelAliases.parse(self.model_alias)

    def validate(self) -> None:
        if self.max_messages < 0:
            raise ValueError("--max-messages must be >= 0 (0: no limit)")
        for name in ("http_port", "grpc_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise ValueError(f"{name} must be in 0..65535, got {port}")
        if self.max_concurrent_requests < 0:
            raise ValueError("max_concurrent_requests must not be negative")
        if self.max_queue_wait <= 0:
            raise ValueError("max_queue_wait must be positive")
        if self.max_queue_wait_ttfts < 0:
            raise ValueError("max_queue_wait_ttfts must not be negative")
        if self.request_timeout <= 0:
            raise ValueError(f"request_timeout must be positive, got {self.request_timeout}")
        self.model_aliases()
        if self.responses_store_size < 0 or self.responses_store_ttl <= 0:
            raise ValueError("responses_store_size must be >= 0 and responses_store_ttl positive")
        if "jetstream" in (self.responses_store, self.turn_links_store) and not self.nats_url:
            raise ValueError("responses_store / turn_links_store jetstream needs nats_url")
        if self.responses_store_replicas < 1 or self.turn_links_replicas < 1:
            raise ValueError("responses_store_replicas and turn_links_replicas must be at least 1")
        if self.turn_links_ttl <= 0:
            raise ValueError("turn_links_ttl must be positive")
