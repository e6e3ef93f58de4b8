"""structlog set up once per process: JSON lines to stderr, correlated with the current trace.

Every line logged while a request is current carries ``trace_id``/``span_id`` and the request's
identity (``session_id``, ``trajectory_id``, ``harness``): from the baggage that crossed the gRPC hop,
or from the current span's attributes (the gateway's root span, before any baggage exists).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog
from opentelemetry import trace

from services.common.tracing import IDENTITY_KEYS, current_identity

_LOG_NAMES = {"session.id": "session_id", "trajectory.id": "trajectory_id", "harness.name": "harness"}


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


def configure_logging(service: str, level: str = "info", fmt: str = "json") -> None:
    """Route structlog and stdlib logging to stderr as JSON (or console) with trace ids."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    renderer: Any = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _add_trace_ids,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr, format="%(name)s %(message)s")
    logging.getLogger("opentelemetry.context").addFilter(_ClosedStreamDetachFilter())
