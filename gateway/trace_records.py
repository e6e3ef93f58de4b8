"""Per-request trace records: one JSON object per line, optionally gzipped (``--trace-records FILE``).

A record holds timing, token counts, the worker and the tool calls' ids and names — never prompt
text or tool arguments. Fields (times in milliseconds; absent values are ``null`` or ``0``)::

    {"v": 1, "ts": 1767225600.123,            # arrival, Unix seconds
     "request_id": "chatcmpl-...", "api": "openai", "model": "demo",
     "session_id": "...", "trajectory_id": "...", "parent_trajectory_id": "", "harness": "codex",
     "trace_id": "32 hex",                    # the OpenTelemetry trace of the turn ("" when unsampled)
     "outcome": "ok", "finish_reason": "tool_calls", "worker_id": "worker-0",
     "prompt_tokens": 1200, "cached_tokens": 1024, "completion_tokens": 57, "reasoning_tokens": 20,
     "ttft_ms": 41.2, "itl_ms": 3.1, "e2e_ms": 230.5,
     "tool_calls": [{"id": "call_1", "name": "get_weather", "dispatch_ms": 180.2}],   # since arrival
     "tool_results": [{"id": "call_0", "name": "get_weather", "tool_ms": 950.0, "is_error": false}]}

``tool_results`` are the results this request carried back for calls the mesh dispatched earlier:
``tool_ms`` is the harness's tool time. ``python -m gateway.mooncake`` turns a record file into a
Mooncake trace for ``harnessmesh replay``.
"""

from __future__ import annotations

import gzip
import json
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import structlog

log = structlog.get_logger()


@dataclass
class TraceRecord:
    """One request, as written to the sink (see the module docstring)."""

    ts: float
    request_id: str
    api: str
    model: str
    session_id: str
    trajectory_id: str
    parent_trajectory_id: str = ""
    harness: str = ""
    trace_id: str = ""
    outcome: str = "ok"
    finish_reason: str = ""
    worker_id: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    ttft_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float = 0.0
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_results: list[dict[str, Any]] = field(default_factory=list)
    v: int = 1

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


class TraceRecordSink:
    """Appends records to a JSONL file (``.gz``: gzip). Writes are small and buffered; ``close`` flushes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str]
        if self.path.suffix == ".gz":
            self._fh = gzip.open(self.path, "at", encoding="utf-8")  # noqa: SIM115 - open for the sink's life
        else:
            self._fh = self.path.open("a", encoding="utf-8", buffering=1)  # line-buffered: tail -f works
        self._lock = threading.Lock()

    def write(self, record: TraceRecord) -> None:
        line = record.to_json() + "\n"
        with self._lock:
            try:
                self._fh.write(line)
            except (OSError, ValueError) as exc:  # a full disk must not fail requests
                log.warning("gateway.trace_record_failed", path=str(self.path), error=str(exc))

    def close(self) -> None:
        with self._lock:
            self._fh.close()


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a (possibly gzipped) record file."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
