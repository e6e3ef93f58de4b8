"""Process-wide logging set-up."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.common.logging import ExportFailureFilter, configure_logging
from tests.support.nats import free_port

REPO = Path(__file__).resolve().parents[1]


def test_benign_detach_errors_of_cancelled_streams_are_filtered(caplog: pytest.LogCaptureFixture) -> None:
    configure_logging("test")
    logger = logging.getLogger("opentelemetry.context")
    try:
        raise ValueError("<Token var=<ContextVar name='current_context'> at 0x1> was created in a different Context")
    except ValueError:
        logger.exception("Failed to detach context")
    try:
        raise ValueError("something else")
    except ValueError:
        logger.exception("Failed to detach context")
    kept = [str(r.exc_info[1]) for r in caplog.records if r.exc_info]
    assert kept == ["something else"]


def test_export_failures_become_one_warning_per_interval() -> None:
    now = [0.0]
    gate = ExportFailureFilter(interval=300.0, clock=lambda: now[0])
    exporter = logging.getLogger("opentelemetry.exporter.otlp.proto.grpc.exporter")

    def record(level: int = logging.WARNING, name: str = exporter.name) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, "Transient error %s, retrying", ("UNAVAILABLE",), None)

    passed = [gate.filter(record()) for _ in range(5)]
    assert passed == [False] * 5  # the first is logged as tracing.export_failed, the rest left out
    now[0] = 301.0
    assert gate.filter(record()) is False and gate._left_out == 0  # the next interval's one line counts them
    assert gate.filter(record(logging.DEBUG)) is True  # below warning: the logger's level decides
    assert gate.filter(record(name="grpc._server")) is True  # not an exporter


def test_a_collector_that_is_down_logs_one_json_line_not_retry_lines(tmp_path: Path) -> None:
    script = (
        "import time\n"
        "from services.common.logging import configure_logging\n"
        "from services.common.tracing import Tracing\n"
        "configure_logging('probe')\n"
        "tracing = Tracing('probe')\n"
        "for _ in range(3):\n"
        "    with tracing.tracer.start_as_current_span('turn'):\n"
        "        pass\n"
        "    time.sleep(0.3)\n"
        "logging_module = __import__('logging')\n"
        "logging_module.getLogger('some.library').warning('plain %s', 'stdlib')\n"
        "time.sleep(2.5)\n"
    )
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",
           "OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_EXPORTER_OTLP_TIMEOUT": "2", "OTEL_TRACES_EXPORTER": "otlp"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env,
                          cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    parsed = [json.loads(line) for line in lines]  # every line is JSON: no bare retry lines
    failed = [p for p in parsed if p["event"] == "tracing.export_failed"]
    assert len(failed) == 1, lines
    assert failed[0]["level"] == "warning" and failed[0]["service"] == "probe" and "127.0.0.1" in failed[0]["detail"]
    plain = [p for p in parsed if p["event"] == "plain stdlib"]
    assert plain and plain[0]["logger"] == "some.library" and plain[0]["level"] == "warning"


LOG_ONE_LINE = (
    "import sys; from services.common.logging import configure_logging; import structlog; "
    "configure_logging('svc', 'info', sys.argv[1]); structlog.get_logger().info('hello.line', answer=42)"
)


def _stderr_of(fmt: str, *, terminal: bool) -> str:
    """What a process configured with ``--log-format fmt`` writes on a stderr that is a pty or a pipe."""
    import pty

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if not terminal:
        done = subprocess.run([sys.executable, "-c", LOG_ONE_LINE, fmt], capture_output=True, text=True,
                              timeout=60, env=env, cwd=REPO, check=True)
        return done.stderr
    primary, secondary = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-c", LOG_ONE_LINE, fmt], stderr=secondary, stdout=subprocess.DEVNULL,
                              timeout=60, env=env, cwd=REPO, check=True)
        assert proc.returncode == 0
        os.close(secondary)
        out = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the writer's side is closed and everything was read
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(primary)
    return out.decode(errors="replace")


@pytest.mark.parametrize(("fmt", "terminal", "human"), [
    ("auto", True, True), ("auto", False, False), ("json", True, False), ("console", False, True)])
def test_log_format_auto_is_console_on_a_terminal_and_json_elsewhere(fmt: str, terminal: bool, human: bool) -> None:
    text = _stderr_of(fmt, terminal=terminal)
    line = next(line for line in text.splitlines() if "hello.line" in line)
    if human:
        assert not line.lstrip().startswith("{") and "answer" in line and "42" in line, line
    else:
        event = json.loads(line)
        assert (event["event"], event["answer"], event["service"]) == ("hello.line", 42, "svc")
