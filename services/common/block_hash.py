"""KV block content hashes, compatible with NVIDIA Dynamo's KV router.

A block's *local* hash is XXH3-64 over its token ids as little-endian u32 with seed 1337
(Dynamo's ``compute_block_hash_for_seq``). Its *sequence* hash chains the prefix: the first block's
sequence hash is its local hash; every later one is XXH3-64 over ``(parent_sequence_hash,
local_hash)`` as two little-endian u64, always with seed 1337 (Dynamo's ``compute_seq_hash_for_block``).
Only full blocks are hashed. A LoRA name or cache salt changes the seed of the *local* hashes exactly as
Dynamo does for ``lora_name`` (``1337 + XXH3-64(name, seed 0)``), so different adapters never share blocks.
``tests/router/test_block_hash.py`` pins values produced by ``ai-dynamo-runtime``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import xxhash

from services.common import token_bytes

SEED = 1337

_xxh3 = xxhash.xxh3_64_intdigest
_pack_pair = struct.Struct("<QQ").pack


def seed_for(salt: str = "") -> int:
    """The hash seed: 1337, or a salt-derived seed when a LoRA name / cache salt is given."""
    if not salt:
        return SEED
    return (SEED + xxhash.xxh3_64_intdigest(salt.encode())) & 0xFFFFFFFFFFFFFFFF


def local_block_hashes(token_ids: Sequence[int], block_size: int, seed: int = SEED) -> list[int]:
    """One hash per *full* block of ``token_ids``."""
    full = len(token_ids) // block_size * block_size
    if not full:
        return []
    data = _u32le(token_ids[:full])
    step = 4 * block_size
    return [_xxh3(data[i : i + step], seed) for i in range(0, 4 * full, step)]


def _u32le(token_ids: Sequence[int]) -> bytes:
    """``token_ids`` as little-endian u32 (a token id outside 0..2**32-1 raises, as ``struct.pack`` would)."""
    try:
        return token_bytes.le32(token_ids)
    except OverflowError as exc:
        raise struct.error(f"token id out of range for u32: {exc}") from None


def chain(parent: int | None, local_hash: int, seed: int = SEED) -> int:
    """The sequence hash of a block whose parent block has sequence hash ``parent``.

    ``seed`` is accepted for older callers and ignored: Dynamo chains with seed 1337 whatever the salt
    (the salt already changed every local hash, so salted chains still never meet unsalted ones).
    """
    del seed
    if parent is None:
        return local_hash
    return _xxh3(_pack_pair(parent, local_hash), SEED)


def sequence_hashes(token_ids: Sequence[int], block_size: int, salt: str = "") -> list[int]:
    """Chained hashes of every full block of ``token_ids``: the keys of the KV index."""
    return extend_hashes([], token_ids, block_size, seed_for(salt))


def extend_hashes(hashes: list[int], token_ids: Sequence[int], block_size: int, seed: int = SEED,
                  limit: int = -1) -> list[int]:
    """Append to ``hashes`` the chained hashes of ``token_ids``' full blocks it lacks; return ``hashes``.

    ``hashes`` must hold the chained hashes of the first ``len(hashes)`` blocks of ``token_ids`` (with this
    ``seed``, i.e. ``seed_for(salt)``): a growing token stream is then hashed once, block by block, as it
    grows. ``limit`` >= 0 stops at that many blocks. The result equals ``sequence_hashes`` of the same tokens.
    """
    done = len(hashes)
    end = len(token_ids) // block_size
    if 0 <= limit < end:
        end = limit
    if end <= done:
        return hashes
    _extend(hashes, _u32le(token_ids[done * block_size : end * block_size]), 0, 4 * block_size, seed)
    return hashes


def chain_hashes(parent: int | None, token_ids: Sequence[int], block_size: int, seed: int = SEED) -> list[int]:
    """The chained hashes of ``token_ids``' full blocks when they follow a block whose sequence hash is
    ``parent`` (None: they start the sequence)."""
    out = [] if parent is None else [parent]
    full = len(token_ids) // block_size * block_size
    _extend(out, _u32le(token_ids[:full]), 0, 4 * block_size, seed)
    return out if parent is None else out[1:]


def _extend(hashes: list[int], data: bytes, start: int, width: int, seed: int, end: int | None = None) -> None:
    """Append the chained hashes of the ``width``-byte blocks of ``data`` from byte ``start`` to ``end`` (None:
    its end)."""
    parent = hashes[-1] if hashes else None
    append = hashes.append
    for i in range(start, len(data) if end is None else end, width):
        local = _xxh3(data[i : i + width], seed)
        parent = local if parent is None else _xxh3(_pack_pair(parent, local), SEED)
        append(parent)


class PrefixHashCache:
    """Block hashes of recent prompts, so that a prompt continuing one of them hashes only its new blocks.

    An agent's next turn is its previous prompt plus a few thousand tokens. Hashing a 100k-token prompt
    costs ~4.8 ms at block size 16 and ~1.9 ms at 64, of which ~0.9 ms is the one conversion of the token
    ids to bytes; with the bytes of recent prompts kept, finding the common prefix is a ``memcmp`` and only
    the blocks past it are hashed (~1 ms in all for a 100k-token next turn). Entries are found by content
    (no session key): among the ``probes`` most recent prompts with the same salt and first block, the one
    sharing the longest full-block prefix is reused. Results always equal :func:`sequence_hashes`.
    Keeps at most ``max_tokens`` prompt tokens (4 bytes each), least recently used dropped first.
    """

    def __init__(self, block_size: int, max_tokens: int = 1 << 21, probes: int = 32) -> None:
        self.block_size = block_size
        self.max_tokens = max_tokens
        self.probes = probes
        self._entries: dict[int, tuple[str, bytes, list[int]]] = {}  # insertion order = LRU order
        self._held = 0
        self._next = 0
        self.reused_blocks = self.hashed_blocks = 0

    def hashes(self, token_ids: Sequence[int] | bytes, salt: str = "") -> list[int]:
        """``sequence_hashes(token_ids, block_size, salt)``, reusing a cached prompt's common prefix.

        ``token_ids`` may be the ids packed as little-endian u32 (``services.common.token_bytes``): hashed as
        they are, with no conversion.
        """
        bs = self.block_size
        packed = isinstance(token_ids, bytes)
        full = (len(token_ids) // 4 if packed else len(token_ids)) // bs
        if not full:
            return []
        # packed: the bytes as they are (read up to the last full block), not a copy of 400 KB per 100k tokens
        data = token_ids if isinstance(token_ids, bytes) else _u32le(token_ids[: full * bs])
        width = 4 * bs
        best_key, best = -1, 0
        for key in list(reversed(self._entries))[: self.probes]:
            e_salt, e_data, e_hashes = self._entries[key]
            limit = min(len(e_hashes), full)
            # Beating ``best`` needs blocks 0 and ``best`` equal too: two 64-byte compares skip the entries that
            # cannot (other sessions under the same system prompt) before any whole-prompt compare.
            at = best * width
            if e_salt != salt or limit <= best or e_data[:width] != data[:width] \
                    or e_data[at : at + width] != data[at : at + width]:
                continue
            n = common_blocks(e_data, data, limit, width)
            if n > best:
                best_key, best = key, n
        out: list[int] = []
        if best:
            entry = self._entries.pop(best_key)
            self._entries[best_key] = entry  # most recently used
            out = entry[2][:best]
        self.reused_blocks += best
        self.hashed_blocks += full - best
        _extend(out, data, best * width, width, seed_for(salt), full * width)
        if best < full and full * bs <= self.max_tokens:
            self._entries[self._next] = (salt, data, list(out))
            self._next += 1
            self._held += full * bs
            while self._held > self.max_tokens:
                self._held -= len(self._entries.pop(next(iter(self._entries)))[2]) * bs
        return out


def common_blocks(a: bytes, b: bytes, limit: int, width: int) -> int:
    """How many leading ``width``-byte blocks (at most ``limit``) ``a`` and ``b`` share (memcmp, whole first;
    ``a`` is read through a memoryview: no part of either is copied)."""
    end = limit * width
    view = memoryview(a)
    if b.startswith(view[:end]):
        return limit  # the usual case: the new prompt continues the old one
    lo, hi = 0, limit - 1  # blocks [0, lo) are equal; the answer lies in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if b.startswith(view[lo * width : mid * width], lo * width):
            lo = mid
        else:
            hi = mid - 1
    return lo
