"""Parser contracts and the marker helpers every marker-based parser needs.

Linearity: a parser is fed one token at a time and may wait a long time for a marker (a header that
never ends, text in a tool section). Nothing it holds is searched or copied again on each feed:
``HeldText`` keeps such text as pieces and searches only where a new piece could complete a marker.
"""

from __future__ import annotations

import re
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
    best, size = 0, len(buffer)
    for marker in markers:
        if not marker:
            continue
        # only where the marker's first character occurs in the last len(marker) - 1 characters
        at = buffer.find(marker[0], max(size - len(marker) + 1, 0))
        while at >= 0 and size - at > best:
            if marker.startswith(buffer[at:]):
                best = size - at
                break
            at = buffer.find(marker[0], at + 1)
    return best


def find_first(buffer: str, markers: tuple[str, ...]) -> tuple[int, str]:
    """Position and text of the earliest occurrence of any of ``markers`` in ``buffer``; (-1, "") if none."""
    best, found = -1, ""
    for marker in markers:
        at = buffer.find(marker)
        if at >= 0 and (best < 0 or at < best):
            best, found = at, marker
    return best, found


def run_end(pattern: re.Pattern[str], text: str, at: int = 0) -> int:
    """Where a run of ``pattern`` (a pattern that also matches nothing, like ``\\s*``) from ``at`` ends."""
    match = pattern.match(text, at)
    return match.end() if match else at


class HeldText:
    """Text held until one of ``markers`` arrives, fed piece by piece in linear time.

    ``add`` appends a piece (kept as a list, never re-copied) and searches only the new piece plus the
    marker-length tail before it, so the earliest marker is found exactly as a search of the whole held
    text would find it. ``text`` joins the pieces once, when the caller is done waiting.
    """

    def __init__(self, markers: tuple[str, ...] = ()) -> None:
        self._markers = tuple(m for m in markers if m)
        self._keep = max(map(len, self._markers), default=1) - 1
        self._parts: list[str] = []
        self._size = 0
        self._tail = ""
        self.head = ""              # the first 64 characters (enough to recognise any marker at the start)

    def __len__(self) -> int:
        return self._size

    def add(self, piece: str) -> tuple[int, str]:
        """Hold ``piece``; (position in the held text, marker) of the earliest marker, or (-1, "") if none yet."""
        if not piece:
            return -1, ""
        window = self._tail + piece
        base = self._size - len(self._tail)
        self._parts.append(piece)
        self._size += len(piece)
        if len(self.head) < 64:
            self.head = (self.head + piece)[:64]
        self._tail = window[-self._keep:] if self._keep else ""
        at, marker = find_first(window, self._markers)
        return (base + at, marker) if at >= 0 else (-1, "")

    def text(self) -> str:
        """Everything held, as one string."""
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""
