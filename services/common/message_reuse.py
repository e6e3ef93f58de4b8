"""Message reuse across the gateway -> parse hop: a conversation's next turn travels as its new messages.

An agent's next request repeats every message of the one before and adds a few: at 100k tokens that is
~240 KB per turn, serialized by the gateway, carried over gRPC, parsed, checked against the limits and
converted again by the parse service (~2 ms of a cached turn's time to first token, measured). So the
gateway (:class:`MessageSender`, one per parse channel) remembers the messages it last sent under each key
(:func:`conversation_key`: the session and trajectory, or for an anonymous request its opening messages),
and the next request under that key carries ``messages_base`` (how many leading messages it shares with
that one, and their digest) and only the messages after them. The parse service (:class:`MessageStore`)
keeps, per key, the digests of the last conversation's messages and what it made of each (its converted
messages), so a shared message is neither sent nor converted again.

The digest of the first ``n`` messages is a chain: ``d(n) = xxh3_64(message n's bytes, seed=d(n-1))``, so
both sides extend it by the new messages only. A parse replica that does not hold the base (evicted,
restarted, another conversation stored under the key since, or the request reached another replica)
answers FAILED_PRECONDITION (:class:`~services.common.errors.PromptBaseUnknownError`) and the gateway
sends the whole request again, once, before any event reached its client. Both sides are LRU maps bounded
in bytes. ``messages_base`` and ``messages_key`` are the gateway's alone: :func:`strip` clears what a
client of the gRPC edge put there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import xxhash
from prometheus_client import CollectorRegistry

from services.api import chat_pb2, common_pb2
from services.common.errors import PromptBaseUnknownError
from services.common.metrics import CounterCallback
from services.common.sequences import common_prefix
from services.common.sized_lru import SizedLru

MIN_REUSE_BYTES = 16 * 1024     # a shorter shared prefix is as cheap to send again
DEFAULT_MAX_BYTES = 256 << 20   # per sender / store: ~1,000 conversations of 100k tokens (240 KB each)
_CONTENT_KEY_MESSAGES = 2       # an anonymous conversation's key: the digest of its first two messages

T = TypeVar("T")


def chain(digest: int, blob: bytes) -> int:
    """The digest of a prefix of messages one message longer (``digest`` 0: the empty prefix)."""
    return xxhash.xxh3_64_intdigest(blob, seed=digest)


def chain_all(blobs: Sequence[bytes], digest: int = 0) -> list[int]:
    """The prefix digests after each of ``blobs``, starting from ``digest``."""
    out = []
    for blob in blobs:
        digest = chain(digest, blob)
        out.append(digest)
    return out


def conversation_key(identity: common_pb2.Identity, blobs: Sequence[bytes]) -> str:
    """The key a conversation's turns share: its session (and trajectory), else its opening messages."""
    if identity.session_id and not identity.anonymous:
        return f"s:{identity.session_id}/{identity.trajectory_id}"
    if len(blobs) < _CONTENT_KEY_MESSAGES:
        return ""
    return f"c:{chain_all(blobs[:_CONTENT_KEY_MESSAGES])[-1]:016x}"


def strip(request: chat_pb2.ChatRequest) -> None:
    """Clear the reuse fields in place (a client's request must not name what parse holds)."""
    request.ClearField("messages_base")
    request.ClearField("messages_key")


@dataclass(frozen=True)
class _Sent:
    blobs: list[bytes]
    digests: list[int]


class MessageSender:
    """Gateway side, one per parse channel: the messages last sent under each key."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._sent: SizedLru[_Sent] = SizedLru(max_bytes)
        self.shortened = 0  # requests sent as their new messages only

    def shorten(self, request: chat_pb2.ChatRequest) -> chat_pb2.ChatRequest | None:
        """Set ``request.messages_key`` and return the request to send instead: a copy with only the
        messages after what the receiver holds, or None (send ``request`` whole). A conversation shorter
        than ``MIN_REUSE_BYTES`` is neither shortened nor kept on either side (a next turn could reuse
        too little of it to pay)."""
        blobs = [m.SerializeToString() for m in request.messages]
        size = sum(map(len, blobs))
        key = conversation_key(request.identity, blobs) if size >= MIN_REUSE_BYTES else ""
        if not key:
            return None
        request.messages_key = key
        last = self._sent.get(key)
        shared = common_prefix(last.blobs, blobs) if last is not None else 0
        digests = last.digests[:shared] if last is not None else []
        digests += chain_all(blobs[shared:], digests[-1] if digests else 0)
        self._sent.put(key, _Sent(blobs, digests), size)
        if not shared or sum(map(len, blobs[:shared])) < MIN_REUSE_BYTES:
            return None
        short = chat_pb2.ChatRequest()
        short.CopyFrom(request)
        del short.messages[:shared]
        short.messages_base.count = shared
        short.messages_base.digest = digests[shared - 1]
        self.shortened += 1
        return short


@dataclass(frozen=True)
class HeldLine(Generic[T]):
    """One conversation a :class:`MessageStore` holds: its messages' prefix digests and converted messages,
    and the bytes they count for."""

    digests: list[int]
    values: list[T]
    size: int


class MessageStore(Generic[T]):
    """Parse side: per key, the last conversation's message digests and converted messages (``T``)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._held: SizedLru[HeldLine[T]] = SizedLru(max_bytes)
        self.rebuilt = 0   # requests that came as their new messages and were made whole
        self.refused = 0   # bases not held here (the gateway sent the request whole again)

    def held(self, request: chat_pb2.ChatRequest) -> list[T]:
        """The converted messages ``request.messages_base`` stands for (none without a base); raise
        :class:`PromptBaseUnknownError` when they are not held here."""
        if not request.HasField("messages_base"):
            return []
        base = request.messages_base
        line = self._held.get(request.messages_key)
        if line is None or base.count == 0 or len(line.digests) < base.count \
                or line.digests[base.count - 1] != base.digest:
            self.refused += 1
            raise PromptBaseUnknownError(
                f"messages base {request.messages_key!r} ({base.count} messages) is not held here")
        self.rebuilt += 1
        return line.values[:base.count]

    def keep(self, request: chat_pb2.ChatRequest, values: Sequence[T], size: Callable[[T], int]) -> None:
        """Hold ``values`` (every message of ``request``'s conversation, converted) under its key, for the
        next turn's base; ``size`` estimates one value's bytes. :meth:`base_digests`, :meth:`prepare` and
        :meth:`put` in turn, for a large request whose :meth:`prepare` (~2.7 us a message) runs off the loop."""
        self.put(request, self.prepare(request, self.base_digests(request), values, size))

    def base_digests(self, request: chat_pb2.ChatRequest) -> list[int]:
        """The digests of the messages ``request.messages_base`` stands for, as held now (none without a base)."""
        count = request.messages_base.count if request.HasField("messages_base") else 0
        line = self._held.get(request.messages_key) if count and request.messages_key else None
        return line.digests[:count] if line is not None else []

    @staticmethod
    def prepare(request: chat_pb2.ChatRequest, base_digests: list[int], values: Sequence[T],
                size: Callable[[T], int]) -> HeldLine[T] | None:
        """What :meth:`put` holds for ``request`` (None: it has no key). Reads nothing of the store's, so it
        may run in a worker thread."""
        if not request.messages_key:
            return None
        digests = base_digests + chain_all([m.SerializeToString() for m in request.messages],
                                           base_digests[-1] if base_digests else 0)
        if len(digests) != len(values):
            raise ValueError(f"{len(values)} converted messages for {len(digests)} messages")
        return HeldLine(digests, list(values), sum(map(size, values)))

    def put(self, request: chat_pb2.ChatRequest, line: HeldLine[T] | None) -> None:
        """Hold ``line`` (from :meth:`prepare`) under ``request``'s key."""
        if line is not None:
            self._held.put(request.messages_key, line, line.size)

def watch(registry: CollectorRegistry, store: MessageStore[T]) -> None:
    """``harnessmesh_message_reuse_bases_total{outcome}``: requests that came as their new messages and were
    made whole (rebuilt), or refused (their base was not held; the gateway sent them whole again)."""
    registry.register(CounterCallback(
        "harnessmesh_message_reuse_bases", "Chat requests that came as the messages after a base, by outcome.",
        ("outcome",), lambda: {("rebuilt",): float(store.rebuilt), ("refused",): float(store.refused)}))
