"""Common prefixes of sequences, compared in C: rendered texts, token id arrays, block hash lists, messages."""

from __future__ import annotations

from array import array
from typing import Any, TypeVar

Seq = TypeVar("Seq", str, "array[int]", "list[Any]")


def common_prefix(a: Seq, b: Seq, chunk: int = 4096) -> int:
    """Length of the common prefix of ``a`` and ``b``: chunks compared as slices (one C compare each; list items
    that are the same objects need no look), then bisection inside the first chunk that differs. ~2n item
    compares, never a Python-level compare per item."""
    n = min(len(a), len(b))
    i = 0
    while i + chunk <= n and a[i:i + chunk] == b[i:i + chunk]:
        i += chunk
    lo, hi = i, min(i + chunk, n)  # a[:lo] == b[:lo]; the first difference (if any) is before hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
