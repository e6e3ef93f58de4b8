"""Packed token ids (``GenerateRequest.token_ids_u32``): exact round trip, bad input refused, hashed as they are."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common import token_bytes
from services.common.block_hash import PrefixHashCache, sequence_hashes
from services.common.errors import InvalidRequestError


@given(st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=300))
def test_pack_unpack_round_trip(ids: list[int]) -> None:
    data = token_bytes.pack(ids)
    assert len(data) == 4 * len(ids) and token_bytes.count(data) == len(ids)
    assert token_bytes.unpack(data) == ids
    ids_array = token_bytes.unpack_array(data)
    assert list(ids_array) == ids and token_bytes.pack(ids_array) == data  # packed again as a buffer copy
    view = token_bytes.view(data)
    assert len(view) == len(ids) and list(view) == ids and list(view[1:-1]) == ids[1:-1]
    assert token_bytes.pack(view) == data


def test_a_view_reads_the_packed_bytes_in_place() -> None:
    data = token_bytes.pack(range(1000, 1100))
    view = token_bytes.view(data)
    assert isinstance(view, memoryview) and view.obj is data and view.readonly  # no copy made
    assert view[5] == 1005 and view[-1] == 1099


def test_little_endian_layout() -> None:
    assert token_bytes.pack([1, 0x01020304]) == b"\x01\x00\x00\x00\x04\x03\x02\x01"


@pytest.mark.parametrize("bad", [[-1], [2**32], ["7"]])
def test_ids_outside_u32_are_an_invalid_request(bad: list[object]) -> None:
    with pytest.raises(InvalidRequestError):
        token_bytes.pack(bad)  # type: ignore[arg-type]


def test_a_torn_buffer_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequestError, match="multiple of 4"):
        token_bytes.unpack(b"\x01\x00\x00")
    with pytest.raises(InvalidRequestError, match="multiple of 4"):
        token_bytes.unpack_array(b"\x01\x00\x00\x00\x02")
    with pytest.raises(InvalidRequestError, match="multiple of 4"):
        token_bytes.view(b"\x01\x00")


@pytest.mark.parametrize("block_size", [16, 64])
def test_prefix_hash_cache_hashes_packed_ids_like_a_list(block_size: int) -> None:
    rng = random.Random(block_size)
    first = [rng.randrange(50_000) for _ in range(5_000)]
    turn2 = [*first, *(rng.randrange(50_000) for _ in range(700))]
    cache = PrefixHashCache(block_size)
    for ids in (first, turn2, first[:1234]):
        assert cache.hashes(token_bytes.pack(ids), "salt") == sequence_hashes(ids, block_size, "salt")
        assert cache.hashes(ids, "salt") == sequence_hashes(ids, block_size, "salt")
    assert cache.reused_blocks > 0


def test_ranges_pack_as_their_ids() -> None:
    """``le32`` packs a range (the replay's trace blocks) without an int per id: the same bytes as ``array``."""
    from array import array

    from services.common.token_bytes import le32

    for ids in (range(0, 1), range(5, 517), range(123 * 512, 124 * 512), range(2**32 - 600, 2**32), range(9, 9),
                range(0, 100, 3), range(7, 7 + 64)):
        assert le32(ids) == array("I", ids).tobytes(), ids
