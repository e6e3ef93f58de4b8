"""The parse service's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.common.metrics import LATENCY_BUCKETS


class ParseMetrics:
    """Streams, render time, prompt builds, tool dispatches and prefix breaks, in one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter("harnessmesh_parse_requests", "Chat streams by outcome (ok, error, rejected).",
                                ("outcome",), registry=r)
        self.active = Gauge("harnessmesh_parse_active_streams", "Chat streams in flight.", registry=r)
        self.render = Histogram("harnessmesh_parse_render_seconds", "Chat template rendering + tokenization.",
                                buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("harnessmesh_parse_prompt_tokens", "Tokens of rendered prompts.", registry=r)
        self.prompt_builds = Counter(
            "harnessmesh_parse_prompt_builds",
            "Prompt tokenizations: build incremental (reason extends, rewritten) or full (reason anonymous, "
            "new_key, rewritten, disabled); see services/parse/prompt_cache.py.", ("build", "reason"), registry=r)
        self.prompt_reused_tokens = Counter("harnessmesh_parse_prompt_reused_tokens",
                                            "Prompt token ids reused from the session's previous turn.", registry=r)
        self.tool_dispatches = Counter("harnessmesh_parse_tool_dispatches",
                                       "Tool calls dispatched while decoding.", registry=r)
        self.prefix_turns = Counter("harnessmesh_parse_prefix_turns",
                                    "Finished turns recorded in the prefix watch (at their finish frame).", registry=r)
        self.prefix_breaks = Counter("harnessmesh_parse_prefix_breaks",
                                     "Prompts that did not extend their session's previous turn, by cause.",
                                     ("in_output", "cause"),
                                     registry=r)
