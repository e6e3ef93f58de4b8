"""Block hashes are Dynamo's: values pinned from ``ai-dynamo-runtime`` 1.6.1 (``compute_block_hash_for_seq``)."""

from __future__ import annotations

import random
import struct

import pytest
import xxhash

from services.common import token_bytes
from services.common.block_hash import (
    SEED,
    PrefixHashCache,
    chain,
    extend_hashes,
    local_block_hashes,
    seed_for,
    sequence_hashes,
)

TOKENS = list(range(64))
# dynamo._core.compute_block_hash_for_seq(list(range(64)), 16)
DYNAMO_LOCAL = [15310707395893867146, 15292316782987903195, 5532946206955930018, 14928757266181269122]
# dynamo._core.compute_block_hash_for_seq(list(range(64)), 16, lora_name="my-lora")
DYNAMO_LOCAL_LORA = [7774427462321301335, 11306793257002815283, 5227710324928887427, 16227747212725006563]
# compute_seq_hash_for_block(DYNAMO_LOCAL): first = local; then xxh3([parent, local] as LE u64, 1337)
DYNAMO_SEQUENCE = [15310707395893867146, 13769157705258532664, 11879827756109914528, 3888788807566526800]


def test_local_hashes_match_dynamo() -> None:
    assert local_block_hashes(TOKENS, 16) == DYNAMO_LOCAL
    assert local_block_hashes(TOKENS, 16, seed_for("my-lora")) == DYNAMO_LOCAL_LORA


def test_sequence_hashes_chain_like_dynamo() -> None:
    assert sequence_hashes(TOKENS, 16) == DYNAMO_SEQUENCE
    expected = [DYNAMO_LOCAL[0]]
    for local in DYNAMO_LOCAL[1:]:
        expected.append(xxhash.xxh3_64_intdigest(struct.pack("<QQ", expected[-1], local), seed=SEED))
    assert expected == DYNAMO_SEQUENCE


def test_salt_changes_every_block_but_chains_with_the_standard_seed() -> None:
    salted = sequence_hashes(TOKENS, 16, "my-lora")
    assert salted[0] == DYNAMO_LOCAL_LORA[0]
    assert salted[1] == chain(DYNAMO_LOCAL_LORA[0], DYNAMO_LOCAL_LORA[1])
    assert not set(salted) & set(DYNAMO_SEQUENCE)


def test_partial_blocks_are_not_hashed() -> None:
    assert sequence_hashes(TOKENS[:63], 16) == DYNAMO_SEQUENCE[:3]
    assert sequence_hashes(TOKENS[:15], 16) == []


def test_extend_hashes_hashes_a_growing_stream_once_and_equals_sequence_hashes() -> None:
    tokens = list(range(1000, 1000 + 200))
    for salt in ("", "my-lora"):
        seed = seed_for(salt)
        grown: list[int] = []
        for cut in (0, 15, 16, 47, 120, 200):
            assert extend_hashes(grown, tokens[:cut], 16, seed) is grown
            assert grown == sequence_hashes(tokens[:cut], 16, salt)
        assert extend_hashes([], tokens, 16, seed, limit=3) == sequence_hashes(tokens, 16, salt)[:3]


def test_token_ids_outside_u32_are_refused() -> None:
    for bad in (-1, 1 << 32):
        with pytest.raises(struct.error):
            sequence_hashes([bad] * 16, 16)


def test_prefix_hash_cache_equals_sequence_hashes_and_reuses_the_common_prefix() -> None:
    rng = random.Random(7)
    cache = PrefixHashCache(16, max_tokens=20_000)
    turn = [rng.randrange(50_000) for _ in range(3000)]
    assert cache.hashes(turn) == sequence_hashes(turn, 16)
    assert cache.reused_blocks == 0
    nxt = [*turn, *(rng.randrange(50_000) for _ in range(500))]  # the next turn continues the last one
    assert cache.hashes(nxt) == sequence_hashes(nxt, 16)
    assert cache.reused_blocks == len(turn) // 16
    forked = [*nxt[:1000], *(rng.randrange(50_000) for _ in range(900))]  # shares 62 full blocks and a bit
    before = cache.reused_blocks
    assert cache.hashes(forked) == sequence_hashes(forked, 16)
    assert cache.reused_blocks - before == 1000 // 16
    assert cache.hashes(nxt, "tenant") == sequence_hashes(nxt, 16, "tenant")  # a salt never reuses unsalted
    assert cache.hashes(nxt[:15]) == []
    for _ in range(20):  # bounded: least recently used prompts go
        cache.hashes([rng.randrange(50_000) for _ in range(3000)])
    assert sum(len(e[1]) // 4 for e in cache._entries.values()) <= 20_000


def test_prefix_hash_cache_reads_packed_prompts_as_they_are() -> None:
    """Packed prompts (the router's and the worker's input) with a partial last block are hashed up to their
    last full block without being cut first; a fork inside a kept prompt is found by the blockwise search."""
    rng = random.Random(8)
    cache = PrefixHashCache(16, max_tokens=20_000)
    turn = [rng.randrange(50_000) for _ in range(3007)]
    assert cache.hashes(token_bytes.pack(turn)) == sequence_hashes(turn, 16)
    nxt = [*turn, *(rng.randrange(50_000) for _ in range(509))]
    assert cache.hashes(token_bytes.pack(nxt)) == sequence_hashes(nxt, 16)
    assert cache.reused_blocks == len(turn) // 16
    forked = [*nxt[:2011], *(rng.randrange(50_000) for _ in range(901))]
    before = cache.reused_blocks
    assert cache.hashes(token_bytes.pack(forked)) == sequence_hashes(forked, 16)
    assert cache.reused_blocks - before == 2011 // 16
    for _ in range(20):  # bounded by the full blocks kept, whatever the bytes past them
        cache.hashes(token_bytes.pack([rng.randrange(50_000) for _ in range(3001)]))
    assert sum(len(e[2]) * 16 for e in cache._entries.values()) <= 20_000
