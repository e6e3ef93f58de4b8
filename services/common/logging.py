"""structlog set up once per process: JSON lines to stderr, correlated with the current trace.

``--log-format auto`` (the default) writes JSON lines unless stderr is a terminal, where a person reads
them: then structlog's console format (``console`` asks for it anywhere, ``json`` for JSON on a terminal).

Every line logged while a request is current carries ``trace_id``/``span_id`` and the request's
identity (``session_id``, ``trajectory_id``, ``harness``): from the baggage that crossed the gRPC hop,
or from the current span's attributes (the gateway's root span, before any baggage exists).

Records of the standard ``logging`` module (grpc, uvicorn, OpenTelemetry's SDK) become the same JSON lines
(``event`` is their message, ``logger`` their logger's name). The OTLP exporter's retry and failure lines
while a collector is down become one ``tracing.export_failed`` warning, then at most one per
:data:`EXPORT_FAILURE_INTERVAL` seconds with the count of those left out.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from typing import Any

import structlog
from opentelemetry import trace

from services.common.tracing import IDENTITY_KEYS, current_identity

LOG_FORMATS = ("auto", "json", "console")
_LOG_NAMES = {"session.id": "session_id", "trajectory.id": "trajectory_id", "harness.name": "harness"}
EXPORT_FAILURE_INTERVAL = 300.0  # seconds between two tracing.export_failed lines
_EXPORTER_LOGGERS = "opentelemetry.exporter"


def _add_trace_ids(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    span = trace.get_current_span()
    ctx = span.get_span_context()
    if ctx.is_valid:
        event_dict["trace_id"] = format(ctx.trace_id, "032x")
        event_dict["span_id"] = format(ctx.span_id, "016x")
    identity = current_identity()
    if len(identity) < len(IDENTITY_KEYS):
        attrs = getattr(span, "attributes", None) or {}
        identity = {key: str(attrs[key]) for key in IDENTITY_KEYS if key in attrs} | identity
    for key, value in identity.items():
        event_dict.setdefault(_LOG_NAMES[key], value)
    return event_dict


class _ClosedStreamDetachFilter(logging.Filter):
    """Drops OpenTelemetry's "Failed to detach context" for streams closed from another context.

    When a client cancels a server stream, grpc.aio closes the handler's async generator from a
    different asyncio context than the one that entered its ``start_as_current_span`` block (ours
    and the grpc instrumentation's). Resetting the context token then raises ValueError, which
    OpenTelemetry logs with a traceback; the span itself has already ended correctly. Anything else
    the logger reports still gets through.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        benign = isinstance(exc, ValueError) and "was created in a different Context" in str(exc)
        return not (benign and record.getMessage() == "Failed to detach context")


class ExportFailureFilter(logging.Filter):
    """Turns the OTLP exporters' warnings and errors (a retry per batch, then a failure, for as long as the
    collector is down) into one ``tracing.export_failed`` warning, then at most one per ``interval`` seconds,
    each counting the lines left out since the previous one. Other records pass unchanged."""

    def __init__(self, interval: float = EXPORT_FAILURE_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()  # exporters log from their own threads
        self._last: float | None = None
        self._left_out = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not record.name.startswith(_EXPORTER_LOGGERS):
            return True
        now = self._clock()
        with self._lock:
            if self._last is not None and now - self._last < self.interval:
                self._left_out += 1
                return False
            left_out, self._left_out, self._last = self._left_out, 0, now
        structlog.get_logger().warning("tracing.export_failed", detail=record.getMessage(), left_out=left_out,
                                       logger=record.name, next_in_s=self.interval)
        return False


def _service_name(service: str) -> Callable[[Any, str, MutableMapping[str, Any]], MutableMapping[str, Any]]:
    """Adds ``service`` to lines logged from threads, which do not see the main thread's context variables."""
    def add(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        event_dict.setdefault("service", service)
        return event_dict
    return add


class _StdlibHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The stderr handler ``configure_logging`` installs on the root logger (replaced by a second call)."""


def resolved_format(fmt: str, stream: Any = None) -> str:
    """``json`` or ``console``: ``auto`` is console when ``stream`` (stderr) is a terminal, else json."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"unknown log format {fmt!r}; valid: {', '.join(LOG_FORMATS)}")
    if fmt != "auto":
        return fmt
    isatty = getattr(stream if stream is not None else sys.stderr, "isatty", None)
    return "console" if isatty is not None and isatty() else "json"


def configure_logging(service: str, level: str = "info", fmt: str = "json") -> None:
    """Route structlog and stdlib logging to stderr as JSON or console lines (``fmt``: :func:`resolved_format`)
    with trace ids."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    on_terminal = fmt == "auto"
    fmt = resolved_format(fmt)
    renderer: Any = (
        structlog.processors.JSONRenderer() if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=on_terminal)  # colours only where auto found a terminal
    )
    shared: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _add_trace_ids,
        _service_name(service),
    ]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            *shared,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)
    handler = _StdlibHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, structlog.processors.format_exc_info,
                    renderer]))
    handler.addFilter(ExportFailureFilter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StdlibHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(max(numeric, logging.WARNING))
    logging.getLogger("opentelemetry.context").addFilter(_ClosedStreamDetachFilter())
