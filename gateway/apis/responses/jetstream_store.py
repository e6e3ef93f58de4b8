"""The Responses store in a NATS JetStream KV bucket that every gateway replica shares.

A response is stored once, when its turn ends (before the client sees the end of the stream, so a
``previous_response_id`` sent to any replica right after finds it), and read when a later request
names it. The bucket bounds it: each response lives ``ttl`` seconds after it was stored (reads do not
extend it, unlike the in-memory store) and past ``max_bytes`` the oldest responses are dropped. A
response larger than one NATS message is stored in chunks (``services.common.jetstream.ChunkedKv``);
one larger than the whole bucket is not stored (logged), and naming it later is a 400 like any
unknown id. While the cluster elects a new leader for the bucket's stream (a node died: ~5 s) a call is
tried again with backoff for ``retry_for`` seconds; NATS unreachable, or the window passed, is a 503
(``UnavailableError``) for the request that needs the store.

Value layout: the response object as JSON, then each conversation message as a serialized
``chat_pb2.Message``, each part preceded by its length (u32 little-endian).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import nats.errors
import nats.js.errors
import orjson
import structlog

from gateway.apis.responses.store import StoredResponse
from services.api import chat_pb2
from services.common.errors import UnavailableError
from services.common.jetstream import ChunkedKv

log = structlog.get_logger()

_LEN = 4


class JetStreamResponseStore:
    """Responses in a JetStream KV bucket (``kv``: a ``ChunkedKv`` over it); see the module docstring."""

    def __init__(self, kv: ChunkedKv, *, bucket: str, ttl: float, max_bytes: int, timeout: float = 5.0,
                 retry_for: float = 10.0) -> None:
        self._kv = kv
        self._retry_for = retry_for  # a JetStream stream leader election takes ~5 s (a 3-node cluster on loopback)
        self.bucket = bucket
        self.ttl = ttl
        self.max_bytes = max_bytes
        self._timeout = timeout

    @property
    def where(self) -> str:
        return f"responses are kept for {self.ttl:g} s after they were stored, in the JetStream bucket {self.bucket}"

    async def put(self, response_id: str, conversation: Sequence[chat_pb2.Message],
                  response: dict[str, Any]) -> None:
        value = encode(StoredResponse(tuple(conversation), response))
        if 0 < self.max_bytes < len(value):
            log.warning("gateway.response_not_stored", response_id=response_id, bytes=len(value),
                        max_bytes=self.max_bytes)
            return
        await self._call(lambda: self._kv.put(response_id, value), "store")

    async def get(self, response_id: str) -> StoredResponse | None:
        blob = await self._call(lambda: self._kv.get(response_id), "read")
        if blob is None or blob.value is None:
            return None
        return decode(blob.value)

    async def delete(self, response_id: str) -> bool:
        deleted: bool = await self._call(lambda: self._kv.delete(response_id), "delete")
        return deleted

    async def _call(self, operation: Callable[[], Awaitable[Any]], verb: str) -> Any:
        """Run ``operation`` (made anew per try); errors a JetStream failover gives (no leader, no response
        from the stream, a timeout) are tried again with backoff for ``retry_for`` seconds; what is left, or
        NATS unreachable, is an UnavailableError (503)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self._retry_for
        backoff = 0.1
        while True:
            try:
                return await asyncio.wait_for(operation(), self._timeout)
            except Exception as exc:
                transient = isinstance(exc, _TRANSIENT)
                if not transient and not isinstance(exc, (OSError, ConnectionError)) \
                        and not type(exc).__module__.startswith("nats"):
                    raise
                if not transient or loop.time() + backoff > give_up:
                    raise UnavailableError(f"cannot {verb} the response in JetStream: "
                                           f"{type(exc).__name__} {exc}".rstrip()) from exc
                log.info("gateway.responses_store_retry", verb=verb, error=type(exc).__name__, backoff=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)


# What a JetStream cluster answers while it elects a stream leader (a node died) or a reconnect is under way:
# the same call succeeds a few seconds later. A closed connection or a refused request does not.
_TRANSIENT = (TimeoutError, nats.errors.TimeoutError, nats.errors.NoRespondersError,
              nats.errors.ConnectionReconnectingError, nats.errors.StaleConnectionError,
              nats.js.errors.NoStreamResponseError, nats.js.errors.ServiceUnavailableError)


def encode(stored: StoredResponse) -> bytes:
    """``stored`` as bytes (layout in the module docstring)."""
    parts = [orjson.dumps(stored.response), *(m.SerializeToString() for m in stored.conversation)]
    return b"".join(len(part).to_bytes(_LEN, "little") + part for part in parts)


def decode(data: bytes) -> StoredResponse:
    """The ``StoredResponse`` :func:`encode` wrote."""
    parts: list[bytes] = []
    at = 0
    while at < len(data):
        size = int.from_bytes(data[at:at + _LEN], "little")
        parts.append(data[at + _LEN:at + _LEN + size])
        at += _LEN + size
    messages = tuple(chat_pb2.Message.FromString(part) for part in parts[1:])
    return StoredResponse(messages, orjson.loads(parts[0]))
