"""The trace-record sink: a ``.gz`` file is readable while the gateway runs, not only after it stops."""

from __future__ import annotations

import gzip
import time
from pathlib import Path

from gateway.trace_records import TraceRecord, TraceRecordSink, read_records


def _record(n: int) -> TraceRecord:
    return TraceRecord(ts=1767225600.0 + n, request_id=f"chatcmpl-{n}", api="openai", model="demo",
                       session_id="S", trajectory_id="T", prompt_tokens=100 + n)


def _wait_for(path: Path, count: int, timeout: float = 5.0) -> list[dict[str, object]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size > 0:
            records = read_records(path)
            if len(records) >= count:
                return records
        time.sleep(0.02)
    raise AssertionError(f"{path} held {path.stat().st_size if path.exists() else 'no'} bytes after {timeout} s")


def test_gzip_records_are_readable_before_close(tmp_path: Path) -> None:
    path = tmp_path / "turns.jsonl.gz"
    sink = TraceRecordSink(path, flush_interval=0.05)
    try:
        sink.write(_record(1))
        sink.write(_record(2))
        assert [r["request_id"] for r in _wait_for(path, 2)] == ["chatcmpl-1", "chatcmpl-2"]
        sink.write(_record(3))  # a later batch: a second gzip member appended to the same file
        assert [r["prompt_tokens"] for r in _wait_for(path, 3)] == [101, 102, 103]
    finally:
        sink.close()
    with gzip.open(path, "rt", encoding="utf-8") as fh:  # one valid gzip stream to the standard reader
        assert len(fh.read().splitlines()) == 3


def test_close_writes_what_is_pending(tmp_path: Path) -> None:
    path = tmp_path / "turns.jsonl.gz"
    sink = TraceRecordSink(path, flush_interval=3600)  # the flusher never wakes: close alone must write
    sink.write(_record(1))
    sink.close()
    assert [r["request_id"] for r in read_records(path)] == ["chatcmpl-1"]


def test_plain_records_are_line_buffered(tmp_path: Path) -> None:
    path = tmp_path / "turns.jsonl"
    sink = TraceRecordSink(path)
    try:
        sink.write(_record(1))
        assert [r["request_id"] for r in read_records(path)] == ["chatcmpl-1"]
    finally:
        sink.close()
