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
    """Appends records to a JSONL file; ``close`` writes what is pending.

    A plain file is line-buffered (``tail -f`` works). A ``.gz`` file gets what accumulated as one complete
    gzip member every ``flush_interval`` seconds (a file of concatenated members is one gzip stream to
    ``gzip``, ``zcat`` and :func:`read_records`), so it is readable while the gateway runs and a crash loses
    at most that interval; the compression happens on the sink's own thread, off the event loop.
    """

    def __init__(self, path: str | Path, flush_interval: float = 1.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._member_lock = threading.Lock()  # one member written at a time, in order
        self._pending: list[str] = []
        self._stop = threading.Event()
        self._fh: IO[str] | None = None
        self._flusher: threading.Thread | None = None
        if self.path.suffix == ".gz":
            self._flusher = threading.Thread(target=self._flush_every, args=(flush_interval,),
                                             name="trace-records", daemon=True)
            self._flusher.start()
        else:
            self._fh = self.path.open("a", encoding="utf-8", buffering=1)

    def write(self, record: TraceRecord) -> None:
        line = record.to_json() + "\n"
        with self._lock:
            if self._fh is None:
                self._pending.append(line)
                return
            try:
                self._fh.write(line)
            except (OSError, ValueError) as exc:  # a full disk must not fail requests
                log.warning("gateway.trace_record_failed", path=str(self.path), error=str(exc))

    def flush(self) -> None:
        """Write the pending records of a ``.gz`` file as one gzip member (nothing to do for a plain file)."""
        with self._member_lock:
            with self._lock:
                lines, self._pending = self._pending, []
            if not lines:
                return
            try:
                with self.path.open("ab") as fh:
                    fh.write(gzip.compress("".join(lines).encode("utf-8")))
            except OSError as exc:  # a full disk must not fail requests
                log.warning("gateway.trace_record_failed", path=str(self.path), error=str(exc), records=len(lines))

    def _flush_every(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()
        self.flush()
        with self._lock:
            if self._fh is not None:
                self._fh.close()


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a (possibly gzipped) record file."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
