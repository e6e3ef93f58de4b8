"""Parser contracts and the one helper every marker-based parser needs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from services.parse.parsers.events import Event


class OutputParser(Protocol):
    """One instance per stream: ``feed`` each decoded delta, then ``finish`` once."""

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Event]: ...

    def finish(self) -> list[Event]: ...


def partial_marker_len(buffer: str, *markers: str) -> int:
    """Length of the longest suffix of ``buffer`` that is a proper prefix of one of ``markers``.

    That suffix must be held back: the next delta may complete the marker.
    """
    best = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(buffer)), best, -1):
            if buffer.endswith(marker[:size]):
                best = size
                break
    return best


def find_first(buffer: str, markers: tuple[str, ...]) -> tuple[int, str]:
    """Position and text of the earliest occurrence of any of ``markers`` in ``buffer``; (-1, "") if none."""
    best, found = -1, ""
    for marker in markers:
        at = buffer.find(marker)
        if at >= 0 and (best < 0 or at < best):
            best, found = at, marker
    return best, found
