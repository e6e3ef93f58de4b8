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

SEED = 1337


def seed_for(salt: str = "") -> int:
    """The hash seed: 1337, or a salt-derived seed when a LoRA name / cache salt is given."""
    if not salt:
        return SEED
    return (SEED + xxhash.xxh3_64_intdigest(salt.encode())) & 0xFFFFFFFFFFFFFFFF


def local_block_hashes(token_ids: Sequence[int], block_size: int, seed: int = SEED) -> list[int]:
    """One hash per *full* block of ``token_ids``."""
    full = len(token_ids) // block_size * block_size
    out = []
    for start in range(0, full, block_size):
        data = struct.pack(f"<{block_size}I", *token_ids[start : start + block_size])
        out.append(xxhash.xxh3_64_intdigest(data, seed=seed))
    return out


def chain(parent: int | None, local_hash: int, seed: int = SEED) -> int:
    """The sequence hash of a block whose parent block has sequence hash ``parent``.

    ``seed`` is accepted for older callers and ignored: Dynamo chains with seed 1337 whatever the salt
    (the salt already changed every local hash, so salted chains still never meet unsalted ones).
    """
    del seed
    if parent is None:
        return local_hash
    return xxhash.xxh3_64_intdigest(struct.pack("<QQ", parent, local_hash), seed=SEED)


def sequence_hashes(token_ids: Sequence[int], block_size: int, salt: str = "") -> list[int]:
    """Chained hashes of every full block of ``token_ids``: the keys of the KV index."""
    seed = seed_for(salt)
    out: list[int] = []
    parent: int | None = None
    for local in local_block_hashes(token_ids, block_size, seed):
        parent = chain(parent, local)
        out.append(parent)
    return out
