"""Replay results: prefix reuse, TTFT, TPOT and throughput (the JSON keys ``harnessmesh replay`` prints)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class RequestRecord:
    """What happened to one request (times in simulated ms since the first arrival)."""

    request_id: str
    arrival_ms: float
    prompt_tokens: int
    max_tokens: int
    worker_id: str
    first_token_ms: float | None = None
    finish_ms: float | None = None
    output_tokens: int = 0
    cached_tokens: int = 0
    error: str = ""  # live replay: the in-band error that ended the stream


@dataclass(frozen=True)
class ReplayResult:
    """Aggregates of one replay."""

    requests: int
    prefix_reuse: float
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    throughput_tok_s: float
    duration_s: float
    failed: int = 0  # requests that ended in an error (live replay only)

    def as_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "failed": self.failed, "prefix_reuse": round(self.prefix_reuse, 4),
                "ttft_ms": {k: round(v, 2) for k, v in self.ttft_ms.items()},
                "tpot_ms": {k: round(v, 3) for k, v in self.tpot_ms.items()},
                "throughput_tok_s": round(self.throughput_tok_s, 1), "duration_s": round(self.duration_s, 2)}


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def summarise(records: list[RequestRecord], end_ms: float) -> ReplayResult:
    done = [r for r in records if r.first_token_ms is not None]
    ttft = sorted(r.first_token_ms - r.arrival_ms for r in done if r.first_token_ms is not None)
    tpot = sorted((r.finish_ms - r.first_token_ms) / (r.output_tokens - 1) for r in done
                  if r.finish_ms is not None and r.first_token_ms is not None and r.output_tokens > 1)
    prompt = sum(r.prompt_tokens for r in records)
    cached = sum(r.cached_tokens for r in records)
    output = sum(r.output_tokens for r in records)
    duration = end_ms / 1000.0
    return ReplayResult(
        requests=len(records),
        prefix_reuse=cached / prompt if prompt else 0.0,
        ttft_ms={"mean": sum(ttft) / len(ttft) if ttft else 0.0, "p50": percentile(ttft, 50),
                 "p90": percentile(ttft, 90), "p99": percentile(ttft, 99)},
        tpot_ms={"mean": sum(tpot) / len(tpot) if tpot else 0.0, "p50": percentile(tpot, 50),
                 "p99": percentile(tpot, 99)},
        throughput_tok_s=output / duration if duration > 0 else 0.0,
        duration_s=duration,
        failed=sum(1 for r in records if r.error),
    )
