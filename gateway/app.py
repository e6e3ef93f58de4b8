"""The starlette application: routes, auth, the request span, and the one HTTP error boundary.

Every error raised before a response's first byte ends here: ``gateway.boundary.public_error``
(internal errors say only "internal error" and the request id), then the shape of the API the
request speaks (``apis/anthropic/errors.py`` or ``apis/openai_chat/errors.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.access_log import AccessLogMiddleware, SpanTapMiddleware
from gateway.admission import Admission
from gateway.apis.anthropic import anthropic_routes
from gateway.apis.anthropic import errors as anthropic_errors
from gateway.apis.openai_chat import errors as openai_errors
from gateway.apis.openai_chat.endpoint import ChatCompletions
from gateway.apis.responses.endpoint import ResponsesApi
from gateway.apis.responses.routes import responses_routes
from gateway.apis.responses.store import ResponseStorage, ResponseStore
from gateway.auth import ApiKeys
from gateway.boundary import public_error, request_id_of
from gateway.catalog import ModelCatalog
from gateway.metrics import GatewayMetrics
from gateway.models_api import ModelsApi
from gateway.parse_client import ParseClient
from gateway.settings import GatewaySettings
from gateway.template_notes import TemplateNotesMiddleware
from gateway.tokenize_api import TokenizeApi
from gateway.turn_tracking import API
from services.common import errors
from services.common.tracing import incoming_parent

# Paths open without an API key (probes, the Prometheus scrape).
_PUBLIC_PATHS = frozenset({"/health", "/ready", "/metrics"})
_UNTRACED_PATHS = frozenset({"/health", "/ready", "/metrics"})
# The API label of each chat route (metrics, trace records); the gRPC edge is API's default.
_APIS = {"/v1/chat/completions": "openai", "/v1/messages": "anthropic", "/v1/responses": "responses",
         "/v1/responses/compact": "responses"}


class RequestSpanMiddleware:
    """A ``gateway.request`` span per HTTP request, current for the whole response.

    A W3C ``traceparent`` (+ ``tracestate``) on the request makes it a child of the caller's span (the
    harness's trace goes on through our hops); without one it is a trace's root. Caller baggage is not read.
    On a chat turn the turn tracker (``gateway/turn_tracking.py``) renames it ``chat {model}`` (the GenAI
    conventions' name) and adds identity, ``gen_ai.*`` and usage attributes; the span propagates to the
    parse service with the call. Probes and ``/metrics`` are not traced.
    """

    def __init__(self, app: ASGIApp, tracer: trace.Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _UNTRACED_PATHS:
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        API.set(_APIS.get(path, "http"))
        route = "/v1/models/{model_id}" if path.startswith("/v1/models/") else path
        status = 0

        async def send_with_status(message: dict[str, object]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])  # type: ignore[call-overload]
            await send(message)  # type: ignore[arg-type]

        attributes = {"http.route": route, "http.request.method": scope["method"]}
        with self.tracer.start_as_current_span(
            "gateway.request", context=_caller_trace(scope), kind=trace.SpanKind.SERVER, attributes=attributes
        ) as span:
            await self.app(scope, receive, send_with_status)  # type: ignore[arg-type]
            span.set_attribute("http.response.status_code", status)


def _caller_trace(scope: Scope) -> Context | None:
    """The caller's trace context from ``traceparent`` / ``tracestate``, if the request has one."""
    carrier: dict[str, list[str]] = {}
    for name, value in scope["headers"]:
        if name == b"traceparent" or name == b"tracestate":
            carrier.setdefault(name.decode(), []).append(value.decode("latin-1"))
    if not carrier:
        return None
    return incoming_parent(carrier)


class BodyLimitMiddleware:
    """Refuses a request body over ``limit`` bytes with 413 in its API's shape: at once from its
    ``Content-Length``, else (chunked) the moment the bytes read pass the limit, before any more is read."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        too_large = errors.RequestTooLargeError(
            f"the request body is over this server's limit of {self.limit} bytes", param="body")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.limit:
            await _api_error(request, too_large)(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise too_large
            return message

        await self.app(scope, limited, send)


class AdmissionGate:
    """Refuses a chat turn at the door when ``admission`` would refuse it whatever its priority (the queue is
    full, or even the next slot is further away than a request may wait): before its body is read, parsed
    or traced, in its API's shape with ``retry-after``, so a refusal under overload costs next to nothing
    and delays neither the other refusals nor the admitted turns. A turn let through is decided again, with
    its priority, when it asks for a slot. The unread body is discarded by the server, so the connection
    stays usable. A request without a valid API key (when keys are set) goes on to its 401.
    """

    def __init__(self, app: ASGIApp, admission: Admission, paths: frozenset[str], keys: Sequence[str]) -> None:
        self.app = app
        self.admission = admission
        self.paths = paths
        self.keys = ApiKeys(keys) if keys else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in self.paths and scope["method"] == "POST":
            request = Request(scope)
            refusal = self.admission.refuse_now() if self.keys is None or self.keys.allows(request.headers) else None
            if refusal is not None:
                await _api_error(request, refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class ApiKeyMiddleware:
    """Rejects requests without one of the configured keys (``Authorization: Bearer`` or ``x-api-key``)."""

    def __init__(self, app: ASGIApp, keys: Sequence[str]) -> None:
        self.app = app
        self.keys = ApiKeys(keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["path"] not in _PUBLIC_PATHS
                and not self.keys.allows(Request(scope).headers)):
            err = errors.UnauthenticatedError("Incorrect or missing API key.")
            await _api_error(Request(scope), err)(scope, receive, send)
            return
        await self.app(scope, receive, send)


class InternalErrorMiddleware:
    """An unexpected exception under it becomes a 500 in the API's shape (logged with the request id) and is
    not raised further: Starlette's own last-resort handler answers too, then re-raises, and the server
    closes the keep-alive connection, failing the client's next request on it. After the response started
    (a stream), the exception is raised as before: streams report their errors in-band themselves."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:
                raise
            await _api_error(Request(scope), exc)(scope, receive, send)


def _api_error(request: Request, exc: BaseException) -> Response:
    """``exc`` as the client may see it, in the error shape of the API the request speaks."""
    anthropic = anthropic_errors.is_anthropic_request(request)
    if isinstance(exc, ValidationError):
        exc = (anthropic_errors if anthropic else openai_errors).from_validation_error(exc)
    request_id = request_id_of(request)
    error = public_error(exc, request_id)
    if anthropic:
        return anthropic_errors.error_response(error, request_id)
    return openai_errors.error_response(error)


async def _on_mesh_error(request: Request, exc: Exception) -> Response:
    return _api_error(request, exc)


async def _on_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ValidationError)
    return _api_error(request, exc)


async def _on_not_found(request: Request, exc: Exception) -> Response:
    if getattr(exc, "status_code", 404) == 405:
        not_allowed = errors.InvalidRequestError(f"{request.method} is not allowed on {request.url.path}")
        response = _api_error(request, not_allowed)
        response.status_code = 405
        return response
    return _api_error(request, errors.NotFoundError(f"{request.url.path} is not a route of this server"))


def _metrics_endpoint(metrics: GatewayMetrics) -> Callable[[Request], Awaitable[Response]]:
    async def scrape(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
    return scrape


def create_app(parse: ParseClient, settings: GatewaySettings, tracer: trace.Tracer | None = None,
               metrics: GatewayMetrics | None = None, *, responses_store: ResponseStorage | None = None) -> Starlette:
    """The gateway's HTTP app over ``parse``; ``tracer`` defaults to the global provider's.

    With ``metrics``, ``GET /metrics`` serves them in Prometheus' text format. ``responses_store`` keeps the
    Responses API's responses (``previous_response_id``, ``GET`` / ``DELETE /v1/responses/{id}``): the one
    ``--responses-store`` chose (``gateway/shared_state.py``); None: a memory store sized by ``settings``.
    """
    catalog = ModelCatalog.load(settings.model_catalog) if settings.model_catalog else ModelCatalog()
    models = ModelsApi(parse, catalog)
    store = responses_store
    if store is None:
        store = ResponseStore(settings.responses_store_size, settings.responses_store_ttl)
    tokenize = TokenizeApi(parse, max_messages=settings.max_messages)
    chat = ChatCompletions(parse, tool_dispatch=settings.enable_streaming_tool_dispatch,
                           max_messages=settings.max_messages)
    routes = [
        Route("/v1/chat/completions", chat.handle, methods=["POST"]),
        *responses_routes(ResponsesApi(parse, store, max_items=settings.max_messages, catalog=catalog,
                                       signing_key=settings.thinking_signature_key)),
        Route("/v1/models", models.list_models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", models.get_model, methods=["GET"]),
        Route("/health", models.health, methods=["GET"]),
        Route("/ready", models.ready, methods=["GET"]),
        Route("/tokenize", tokenize.tokenize, methods=["POST"]),
        Route("/detokenize", tokenize.detokenize, methods=["POST"]),
    ]
    if metrics is not None:
        routes.append(Route("/metrics", _metrics_endpoint(metrics), methods=["GET"]))
    if settings.enable_anthropic_api:
        routes.extend(anthropic_routes(parse, settings))
    app = Starlette(
        routes=routes,
        exception_handlers={
            errors.MeshError: _on_mesh_error,
            ValidationError: _on_validation_error,
            404: _on_not_found,
            405: _on_not_found,
            Exception: _on_mesh_error,  # anything unexpected: a 500 in OpenAI's shape
        },
    )
    if settings.api_key:
        app.add_middleware(ApiKeyMiddleware, keys=settings.api_key)
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_request_bytes)
    app.add_middleware(TemplateNotesMiddleware, paths=frozenset(_APIS))  # x-harnessmesh-tools-unrendered
    app.add_middleware(InternalErrorMiddleware)  # inside the span: a 500 still ends the request's span with it
    app.add_middleware(SpanTapMiddleware)  # the turn's identity and usage, for the access line
    app.add_middleware(RequestSpanMiddleware, tracer=tracer or trace.get_tracer("harnessmesh.gateway"))
    chat_paths = frozenset(p for p in _APIS if settings.enable_anthropic_api or p != "/v1/messages")
    app.add_middleware(AdmissionGate, admission=parse.admission, paths=chat_paths, keys=settings.api_key)
    app.add_middleware(AccessLogMiddleware)  # outermost: refusals at the door get their line too
    return app
