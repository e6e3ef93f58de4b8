"""JetStream key-value buckets for state that must outlive one replica (see docs/state.md).

:func:`open_bucket` creates a KV bucket, or updates one another replica made: a value lives ``ttl``
seconds after it was written, and past ``max_bytes`` the oldest values are dropped (nats-py's own
``create_key_value`` refuses new writes instead, which would turn a full cache into an error).

:class:`ChunkedKv` stores values of any size in such a bucket. A NATS message is capped (the server's
``max_payload``, 1 MiB by default), so a value above ``inline_max`` bytes goes in chunks under
``<key>.<version>.<i>`` and the key itself holds a small index naming that version. A reader that
already holds a version learns so from the index alone (one small get), which is what a per-request
freshness check needs. Values are zlib-compressed when that makes them smaller. Keys may be any
string: they are base64url-encoded into NATS subject tokens.
"""

from __future__ import annotations

import asyncio
import base64
import re
import secrets
import zlib
from dataclasses import dataclass
from typing import Any

from nats.js import api
from nats.js.errors import BadRequestError, KeyNotFoundError, NotFoundError

STREAM_IN_USE = 10058  # JetStream: "stream name already in use with a different configuration"
COMPRESS_MIN = 1024  # smaller values are stored as they are
THREAD_MIN = 256 << 10  # (de)compress values this large off the event loop
# In a JetStream cluster a stream another replica is creating at the same moment can answer "in use", then "not
# found", until its Raft group settles; opening retries that, this many times, pausing a little longer each time.
OPEN_ATTEMPTS = 12
OPEN_PAUSE = 0.05  # seconds, times the attempt's number
_HEADER_END = b"\n"


@dataclass(frozen=True)
class BucketConfig:
    """A KV bucket: its name, how long a value lives, its size cap and where the servers keep it."""

    name: str
    ttl: float  # seconds a value lives after it was written
    max_bytes: int = -1  # the bucket's cap (-1: none); past it the oldest values are dropped
    memory: bool = False  # in the servers' memory (lost when NATS restarts) rather than on disk
    replicas: int = 1  # copies in a JetStream cluster


async def open_bucket(js: Any, config: BucketConfig) -> Any:
    """The bucket ``config`` names, created or brought to ``config`` (every replica calls this at start)."""
    stream = api.StreamConfig(
        name=f"KV_{config.name}",
        subjects=[f"$KV.{config.name}.>"],
        allow_direct=True,
        allow_rollup_hdrs=True,
        deny_delete=True,
        discard=api.DiscardPolicy.OLD,
        duplicate_window=min(120.0, config.ttl),
        max_age=config.ttl,
        max_bytes=config.max_bytes,
        max_msgs=-1,
        max_msgs_per_subject=1,
        num_replicas=config.replicas,
        storage=api.StorageType.MEMORY if config.memory else api.StorageType.FILE,
    )
    for attempt in range(1, OPEN_ATTEMPTS + 1):
        try:
            return await _create_or_update(js, stream, config.name)
        except NotFoundError:
            if attempt == OPEN_ATTEMPTS:
                raise
            await asyncio.sleep(OPEN_PAUSE * attempt)
    raise AssertionError("unreachable")


async def _create_or_update(js: Any, stream: api.StreamConfig, name: str) -> Any:
    try:
        await js.add_stream(stream)
    except BadRequestError as exc:
        if exc.err_code != STREAM_IN_USE:
            raise
        await js.update_stream(stream)
    return await js.key_value(name)


def bucket_name(configured: str, namespace: str, kind: str) -> str:
    """``configured``, else ``harnessmesh_<namespace>_<kind>`` (what a bucket name may not hold made ``_``)."""
    return configured or re.sub(r"[^A-Za-z0-9_-]", "_", f"harnessmesh_{namespace}_{kind}")


def kv_key(key: str) -> str:
    """``key`` as one NATS subject token (base64url without padding); an empty key is refused."""
    if not key:
        raise ValueError("an empty key cannot be stored")
    return base64.urlsafe_b64encode(key.encode()).rstrip(b"=").decode()


@dataclass(frozen=True)
class Blob:
    """One stored version of a value; ``value`` is None when the reader already held this version."""

    version: str
    chunks: int  # 0: the value is inline in the index
    value: bytes | None


class ChunkedKv:
    """Values of any size in a KV bucket (layout in the module docstring); one instance per bucket."""

    def __init__(self, kv: Any, *, chunk_size: int, inline_max: int | None = None) -> None:
        if chunk_size <= 0:
            raise ValueError("chunk_size must be positive")
        self._kv = kv
        self.chunk_size = chunk_size
        self.inline_max = chunk_size if inline_max is None else min(inline_max, chunk_size)

    async def put(self, key: str, value: bytes, *, replaces: Blob | None = None) -> Blob:
        """Store ``value`` under ``key``; the chunks of ``replaces`` (the version it overwrites) are deleted."""
        k = kv_key(key)
        data, compressed = await _compress(value)
        version = secrets.token_hex(8)
        chunks = 0
        if len(data) > self.inline_max:
            parts = [data[i:i + self.chunk_size] for i in range(0, len(data), self.chunk_size)]
            await asyncio.gather(*(self._kv.put(f"{k}.{version}.{i}", part) for i, part in enumerate(parts)))
            chunks, data = len(parts), b""
        header = f"{version} {chunks} {int(compressed)}".encode() + _HEADER_END
        await self._kv.put(k, header + data)  # the index last: no reader sees a version before its chunks
        if replaces is not None and replaces.chunks:
            await self._delete_chunks(k, replaces)
        return Blob(version, chunks, value)

    async def get(self, key: str, *, known: str = "") -> Blob | None:
        """The value under ``key`` (None: absent, expired or partly dropped); only the index when the
        stored version is ``known``."""
        k = kv_key(key)
        index = await self._get(k)
        if index is None:
            return None
        head, _, inline = index.partition(_HEADER_END)
        version, chunks_text, compressed = head.decode().split(" ")
        chunks = int(chunks_text)
        if version == known:
            return Blob(version, chunks, None)
        if chunks:
            parts = await asyncio.gather(*(self._get(f"{k}.{version}.{i}") for i in range(chunks)))
            if any(part is None for part in parts):
                return None  # dropped by the bucket's size cap, or overwritten and cleaned up meanwhile
            inline = b"".join(part for part in parts if part is not None)
        return Blob(version, chunks, await _decompress(inline) if compressed == "1" else inline)

    async def delete(self, key: str) -> bool:
        """Delete the value under ``key``; False when there was none."""
        k = kv_key(key)
        index = await self._get(k)
        if index is None:
            return False
        version, chunks, _ = index.partition(_HEADER_END)[0].decode().split(" ")
        await self._kv.delete(k)
        await self._delete_chunks(k, Blob(version, int(chunks), None))
        return True

    async def _delete_chunks(self, k: str, blob: Blob) -> None:
        await asyncio.gather(*(self._kv.delete(f"{k}.{blob.version}.{i}") for i in range(blob.chunks)))

    async def _get(self, k: str) -> bytes | None:
        try:
            entry = await self._kv.get(k)
        except KeyNotFoundError:  # KeyDeletedError included
            return None
        value: bytes | None = entry.value
        return value


async def _compress(value: bytes) -> tuple[bytes, bool]:
    if len(value) < COMPRESS_MIN:
        return value, False
    packed = await asyncio.to_thread(zlib.compress, value, 1) if len(value) >= THREAD_MIN else zlib.compress(value, 1)
    return (packed, True) if len(packed) < len(value) else (value, False)


async def _decompress(data: bytes) -> bytes:
    if len(data) >= THREAD_MIN // 4:
        return await asyncio.to_thread(zlib.decompress, data)
    return zlib.decompress(data)


def chunk_size_for(nc: Any) -> int:
    """The largest chunk a connection may publish: the server's ``max_payload`` less room for headers."""
    return max(int(nc.max_payload) - 4096, 1024)
