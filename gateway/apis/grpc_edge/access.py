"""The gRPC edge's access line: ``gateway.access`` at info level, one per ``AgentService/Chat`` call.

The same fields as the HTTP line (``gateway/access_log.py``): ``method`` (``grpc``), ``path`` (the full
method name), ``status`` (the gRPC status name: ``OK``, or the error that ended the call or the stream),
``duration_ms`` (until the call ends), ``request_id``, ``model`` / ``requested_model`` / ``model_alias``
(how the request's model name resolved), and ``session_id``, ``trajectory_id``, ``harness``,
``prompt_tokens``, ``completion_tokens``, ``cached_tokens`` as far as the turn got. Never a prompt.
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from services.api import chat_pb2, common_pb2
from services.common import errors

log = structlog.get_logger()

CHAT_METHOD = "/harnessmesh.v1.AgentService/Chat"


class AccessLine:
    """Collects one Chat call's access line as its batches pass; :meth:`write` logs it once."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.identity: common_pb2.Identity | None = None
        self.status = "OK"
        self.fields: dict[str, Any] = {}
        self._started = time.perf_counter()
        self._written = False

    def observe(self, batch: chat_pb2.ChatEventBatch) -> None:
        """Take the usage and an in-band error from a batch the client is sent."""
        for event in batch.events:
            kind = event.WhichOneof("event")
            if kind == "usage":
                usage = event.usage
                self.fields.update(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                                   cached_tokens=usage.cached_tokens)
            elif kind == "error":
                self.status = errors.from_proto(event.error).grpc_status.name

    def failed(self, exc: BaseException) -> None:
        self.status = errors.as_mesh_error(exc).grpc_status.name

    def cancelled(self) -> None:
        self.status = "CANCELLED"  # the client went away (or the server stops)

    def write(self) -> None:
        if self._written:
            return
        self._written = True
        identity = self.identity
        who = {} if identity is None else {"session_id": identity.session_id,
                                           "trajectory_id": identity.trajectory_id, "harness": identity.harness}
        log.info("gateway.access", method="grpc", path=CHAT_METHOD, status=self.status,
                 duration_ms=round((time.perf_counter() - self._started) * 1000, 3), request_id=self.request_id,
                 **who, **self.fields)
