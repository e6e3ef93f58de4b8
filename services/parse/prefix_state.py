"""Where a session's prefix-watch histories live besides this replica's memory.

A session's next turn may land on another parse replica; that replica must compare the new prompt with
the session's last turn, wherever it ran. :class:`PrefixState` is the service's one collaborator for it,
called around every turn that has a session:

- ``pull`` before the turn's first token, overlapped with the prompt's render: brings the session's
  histories into the watch when another replica changed them. With JetStream that is one small get of
  the session's index (its version); the histories themselves are read only when the version is not
  the one this replica holds (another replica ran the last turn, or this one forgot the session).
- ``push`` once the turn is committed, after its last token (never per token): writes the session's
  histories, so the next turn finds them on any replica.

:class:`LocalPrefixState` is the single-process mode: the watch's own memory is the only copy.
:class:`JetStreamPrefixState` keeps them in a KV bucket keyed by the watch's session key (session +
trajectory), with the bucket's TTL and size cap. The prefix watch is advisory: a NATS that is down or
slow costs at most ``timeout`` per turn (nothing while the connection is known to be down) and a
warning, never a failed request. Two turns of one session running at once on two replicas: the last
one to finish wins (as one replica's watch does with its lines).
"""

from __future__ import annotations

import asyncio
import sys
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from services.common.jetstream import Blob, ChunkedKv
from services.common.token_bytes import le32
from services.parse.prefix_watch import History, PrefixWatch

log = structlog.get_logger()

_U32 = 4


class PrefixState(Protocol):
    """A shared copy of the prefix watch's per-session histories (see the module docstring)."""

    shared: bool  # False: the watch's memory is the only copy (the service skips pull and push: no task per turn)

    async def pull(self, watch: PrefixWatch, session: str) -> None: ...

    async def push(self, watch: PrefixWatch, session: str) -> None: ...


class LocalPrefixState:
    """The single-process mode: the watch's memory is the only copy, there is nothing to pull or push."""

    shared = False

    async def pull(self, watch: PrefixWatch, session: str) -> None:
        return None

    async def push(self, watch: PrefixWatch, session: str) -> None:
        return None


class JetStreamPrefixState:
    """Histories in a JetStream KV bucket (``kv``), read through when this replica's copy is stale."""

    shared = True

    def __init__(self, kv: ChunkedKv, *, timeout: float = 1.0, connected: Callable[[], bool] = lambda: True,
                 max_sessions: int = 4096) -> None:
        self._kv = kv
        self._timeout = timeout
        self._connected = connected
        self._max_sessions = max_sessions
        self._versions: OrderedDict[str, Blob] = OrderedDict()  # session -> the version the watch holds

    async def pull(self, watch: PrefixWatch, session: str) -> None:
        if not session or not self._connected():
            return
        held = self._versions.get(session) if watch.histories(session) is not None else None
        try:
            blob = await asyncio.wait_for(self._kv.get(session, known=held.version if held else ""), self._timeout)
        except Exception as exc:
            log.warning("parse.prefix_state_unavailable", op="pull", error=f"{type(exc).__name__}: {exc}")
            return
        if blob is None or blob.value is None:  # nothing shared yet, or this replica's copy is current
            return
        watch.restore(session, decode(blob.value))
        self._remember(session, blob)

    async def push(self, watch: PrefixWatch, session: str) -> None:
        histories = watch.histories(session)
        if not session or not histories or not self._connected():
            return
        try:
            blob = await asyncio.wait_for(
                self._kv.put(session, encode(histories), replaces=self._versions.get(session)), self._timeout)
        except Exception as exc:
            log.warning("parse.prefix_state_unavailable", op="push", error=f"{type(exc).__name__}: {exc}")
            return
        self._remember(session, blob)

    def _remember(self, session: str, blob: Blob) -> None:
        self._versions.pop(session, None)
        self._versions[session] = Blob(blob.version, blob.chunks, None)
        while len(self._versions) > self._max_sessions:
            self._versions.popitem(last=False)


def encode(histories: Sequence[History]) -> bytes:
    """Histories as bytes: their count, then per history its prompt length, token count and tokens (u32 LE)."""
    parts = [le32([len(histories)])]
    for history in histories:
        parts += [le32([history.prompt_len, len(history.tokens)]), le32(history.tokens)]
    return b"".join(parts)


def decode(data: bytes) -> list[History]:
    """The histories :func:`encode` wrote."""
    count = int.from_bytes(data[:_U32], "little")
    at, out = _U32, []
    for _ in range(count):
        prompt_len = int.from_bytes(data[at:at + _U32], "little")
        size = int.from_bytes(data[at + _U32:at + 2 * _U32], "little")
        at += 2 * _U32
        tokens = array("I")
        tokens.frombytes(data[at:at + size * _U32])
        if sys.byteorder != "little":  # pragma: no cover - big-endian hosts
            tokens.byteswap()
        out.append(History(tokens, prompt_len))
        at += size * _U32
    return out
