"""The parse service's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.common.metrics import LATENCY_BUCKETS, CounterCallback, GaugeCallback
from services.common.tool_wait import ToolWaits


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

    def watch_tool_waits(self, waits: ToolWaits) -> None:
        """Export ``waits`` per harness: the tool-call hold it gives now and the waits it saw (read at scrape)."""
        def hold() -> dict[tuple[str, ...], float]:
            return {(h,): v[0] for h, v in waits.snapshot().items()}

        def seen() -> dict[tuple[str, ...], float]:
            return {(h,): float(v[1]) for h, v in waits.snapshot().items()}

        self.registry.register(GaugeCallback(
            "harnessmesh_parse_tool_wait_hold_seconds", "The KV hold a harness's tool-call turn gets now: its tool "
            "waits' p90 x 1.5 within [10 s, 600 s], 60 s until 16 were seen (docs/agent-kv.md).", ("harness",), hold))
        self.registry.register(CounterCallback(
            "harnessmesh_parse_tool_waits", "Tool waits observed (a tool-call turn's end to its session's next "
            "turn), by harness.", ("harness",), seen))
