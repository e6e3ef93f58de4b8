"""Block hashes are Dynamo's: values pinned from ``ai-dynamo-runtime`` 1.6.1 (``compute_block_hash_for_seq``)."""

from __future__ import annotations

import struct

import xxhash

from services.common.block_hash import SEED, chain, local_block_hashes, seed_for, sequence_hashes

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
