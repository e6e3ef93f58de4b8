"""What the model's chat template does with a request, told to clients: ``/v1/models`` and per-request marks.

The parse service decides at start-up how its chat template is handed inline system messages and whether the
template renders tools (``services/parse/template_forms.py``) and reports it in ``ModelInfo``. Here:

- :func:`template_card`: the ``chat_template`` object of a ``/v1/models`` card;
- a chat request with tools for a template that does not render them (and no tool prompt does) gets the response
  header :data:`TOOLS_UNRENDERED_HEADER` and the span attribute :data:`TOOLS_UNRENDERED_ATTRIBUTE`, so tools that
  reach the model nowhere are never lost silently. :func:`note_request` marks the turn (``ParseClient.chat`` calls
  it for every API); :class:`TemplateNotesMiddleware` adds the header when the response starts.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from opentelemetry import trace
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api import chat_pb2

TOOLS_UNRENDERED_HEADER = "x-harnessmesh-tools-unrendered"
TOOLS_UNRENDERED_ATTRIBUTE = "harnessmesh.tools_unrendered"
_HEADER_VALUE = b"the model's chat template does not render tools: this request's tools were not shown to the model"


def template_card(info: chat_pb2.ModelInfo) -> dict[str, Any]:
    """The ``chat_template`` object of a model card (a parse service that predates it reports empty fields)."""
    return {
        "inline_system": info.inline_system or None,
        "inline_system_reason": info.inline_system_reason or None,
        "renders_tools": not info.tools_unrendered,
        "tool_prompt": info.tool_prompt or None,
    }


class _Notes:
    """One HTTP request's marks, shared by every task that serves it (a mutable holder in a context variable)."""

    __slots__ = ("tools_unrendered",)

    def __init__(self) -> None:
        self.tools_unrendered = False


_NOTES: ContextVar[_Notes | None] = ContextVar("harnessmesh_template_notes", default=None)


def note_request(request: chat_pb2.ChatRequest, info: chat_pb2.ModelInfo | None) -> bool:
    """Mark the current request and span when ``request`` has tools the model's template does not render; True
    when it was marked."""
    if not request.tools or info is None or not info.tools_unrendered:
        return False
    trace.get_current_span().set_attribute(TOOLS_UNRENDERED_ATTRIBUTE, True)
    notes = _NOTES.get()
    if notes is not None:
        notes.tools_unrendered = True
    return True


class TemplateNotesMiddleware:
    """Adds :data:`TOOLS_UNRENDERED_HEADER` to the response of a chat request :func:`note_request` marked."""

    def __init__(self, app: ASGIApp, paths: frozenset[str]) -> None:
        self.app = app
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        notes = _Notes()
        token = _NOTES.set(notes)

        async def send_marked(message: Message) -> None:
            if message["type"] == "http.response.start" and notes.tools_unrendered:
                message = {**message, "headers": [*message.get("headers", ()),
                                                  (TOOLS_UNRENDERED_HEADER.encode(), _HEADER_VALUE)]}
            await send(message)

        try:
            await self.app(scope, receive, send_marked)
        finally:
            _NOTES.reset(token)
