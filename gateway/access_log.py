"""One structured access line per HTTP request: ``gateway.access`` at info level.

Fields: ``method``, ``path`` (no query string), ``status`` (0: no response was started), ``duration_ms``
(until the last byte of the response, a stream's included), ``request_id`` (the id the client was given:
``chatcmpl-…``, ``msg_…``, ``resp_…``, else a ``req_…`` one), for a request that names a model ``model``
(the served model it resolved to), ``requested_model`` (the name asked for) and ``model_alias`` (the
``--model-alias`` entry, exact name or pattern, that matched), and for a chat turn ``session_id``,
``trajectory_id``, ``harness``, ``prompt_tokens``, ``completion_tokens``, ``cached_tokens`` when the turn got
that far. Never a prompt, a header value or a body. Probes and ``/metrics`` log at debug level.

Two middlewares: :class:`AccessLogMiddleware`, outermost, times every request (refusals at the door
included) and writes the line; :class:`SpanTapMiddleware`, just inside the request span, makes the span
the handlers see an :class:`AttributeTap`, which keeps a copy of the attributes the turn tracker sets on it
(identity, usage): the access line has them whether the trace is sampled or not. The tap says it records,
so the tracker builds those attributes for an unsampled turn too (a few microseconds a turn; the real span
still drops them when it does not record).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import structlog
from opentelemetry import trace
from opentelemetry.util.types import Attributes, AttributeValue
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.boundary import request_id_of
from gateway.model_aliases import MODEL_ALIAS, REQUESTED_MODEL, RESOLVED_MODEL
from services.common.tracing import HARNESS, SESSION, TRAJECTORY

log = structlog.get_logger()

_SEEN_KEY = "harnessmesh_span_attributes"  # scope["state"] entry: the attributes the tap saw
_QUIET_PATHS = frozenset({"/health", "/ready", "/metrics"})
# access-line field -> span attributes that may carry it (the first present wins)
_FIELDS: dict[str, tuple[str, ...]] = {
    "model": (RESOLVED_MODEL,),
    "requested_model": (REQUESTED_MODEL,),
    "model_alias": (MODEL_ALIAS,),
    "session_id": (SESSION,),
    "trajectory_id": (TRAJECTORY,),
    "harness": (HARNESS,),
    "prompt_tokens": ("gen_ai.usage.input_tokens",),
    "completion_tokens": ("gen_ai.usage.output_tokens",),
    "cached_tokens": ("gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cached_tokens"),
}


class AttributeTap(trace.Span):
    """``span`` as the handlers see it: every call goes to ``span``; the attributes set are also kept in
    ``seen`` (sampled or not), and :attr:`attributes` shows them (the log processor reads identity there)."""

    def __init__(self, span: trace.Span, seen: dict[str, Any]) -> None:
        self._span = span
        self._seen = seen

    @property
    def attributes(self) -> Mapping[str, Any]:
        return {**(getattr(self._span, "attributes", None) or {}), **self._seen}

    def end(self, end_time: int | None = None) -> None:
        self._span.end(end_time)

    def get_span_context(self) -> trace.SpanContext:
        return self._span.get_span_context()

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        self._seen.update(attributes)
        self._span.set_attributes(attributes)

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        self._seen[key] = value
        self._span.set_attribute(key, value)

    def add_event(self, name: str, attributes: Attributes = None, timestamp: int | None = None) -> None:
        self._span.add_event(name, attributes, timestamp)

    def add_link(self, context: trace.SpanContext, attributes: Attributes = None) -> None:
        self._span.add_link(context, attributes)

    def update_name(self, name: str) -> None:
        self._span.update_name(name)

    def is_recording(self) -> bool:
        return True  # attributes set on it are always kept (here), whether the span itself records or not

    def set_status(self, status: trace.Status | trace.StatusCode, description: str | None = None) -> None:
        self._span.set_status(status, description)

    def record_exception(self, exception: BaseException, attributes: Attributes = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        self._span.record_exception(exception, attributes, timestamp, escaped)


class SpanTapMiddleware:
    """Put an :class:`AttributeTap` over the request's span (add it right inside ``RequestSpanMiddleware``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        seen = scope.get("state", {}).get(_SEEN_KEY)
        if scope["type"] != "http" or seen is None:
            await self.app(scope, receive, send)
            return
        with trace.use_span(AttributeTap(trace.get_current_span(), seen), end_on_exit=False):
            await self.app(scope, receive, send)


class AccessLogMiddleware:
    """Writes the ``gateway.access`` line of every HTTP request when its response is done (add it last:
    outermost). ``SpanTapMiddleware`` fills in the turn's identity and usage."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        seen: dict[str, Any] = {}
        scope.setdefault("state", {})[_SEEN_KEY] = seen
        status = 0

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            path: str = scope["path"]
            write = log.debug if path in _QUIET_PATHS else log.info
            write("gateway.access", method=scope["method"], path=path, status=status,
                  duration_ms=round((time.perf_counter() - started) * 1000, 3),
                  request_id=_request_id(scope), **_turn_fields(seen))


def _request_id(scope: Scope) -> str:
    return request_id_of(HTTPConnection(scope))


def _turn_fields(seen: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field, keys in _FIELDS.items():
        value = next((seen[k] for k in keys if k in seen), None)
        if value is not None and value != "":
            out[field] = value
    return out


__all__ = ["AccessLogMiddleware", "AttributeTap", "SpanTapMiddleware"]
