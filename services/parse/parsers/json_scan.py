"""Where one JSON value ends, found incrementally: each feed resumes where the previous one stopped.

The scanner is a state machine (before the value / in a string / in containers / in a number or
literal) that keeps its state between calls, so a value fed one token at a time is read once: runs of
ordinary characters and whole strings are skipped by one regex match (C speed); only brackets, a string
left open at the end of the input and possible stop markers cost a Python step.
"""

from __future__ import annotations

import re
from enum import Enum

from services.parse.parsers.base import run_end

_STRING_BODY = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*', re.S)  # up to the closing quote (or a final lone backslash)
_OPENERS = re.compile(r"[\[{]+")
_SCALAR_END = " \t\r\n},];"


class Scan(Enum):
    """Why ``JsonScanner.scan`` returned."""

    MORE = 0      # all input consumed, or a possible stop marker waits at the returned index: feed more
    DONE = 1      # the value ended just before the returned index
    STOP = 2      # a stop marker begins at the returned index, outside any string, before the value ended
    COLON = 3     # a watched ``:`` of the outermost object was consumed (the returned index is after it)


class _M(Enum):
    BEFORE = 0
    STRING = 1
    CONTAINER = 2
    SCALAR = 3
    DONE = 4


def _container(extra: str) -> re.Pattern[str]:
    """Inside containers: anything but brackets, quotes and ``extra``, and whole strings."""
    plain = rf'[^"{{}}\[\]{extra}]*'
    return re.compile(rf'{plain}(?:"[^"\\]*(?:\\.[^"\\]*)*"{plain})*', re.S)


class _Skips:
    """The skip regexes for one set of stop markers: ordinary characters, never a stop's first character."""

    def __init__(self, stop_first: str) -> None:
        extra = re.escape(stop_first)
        self.space = re.compile(rf"(?:(?![{extra}])\s)*" if stop_first else r"\s*")
        self.container = _container(extra)
        self.container_colon = _container(":" + extra)
        self.scalar = re.compile(rf"[^{re.escape(_SCALAR_END)}{extra}]*")


_SKIPS: dict[str, _Skips] = {}


class JsonScanner:
    """Finds where one JSON value ends (strings and nesting aware), fed any number of pieces.

    ``depth`` > 0 starts inside that many open containers (to skip to an object's end). ``stops``: markers
    that end the scan when they begin outside a string (a call's end marker before its arguments closed);
    half a stop at the end of the input waits for more unless ``final``. ``colons``: report (``Scan.COLON``)
    the first that many ``:`` of the outermost object. ``record``: keep the value's text for ``take``.
    """

    def __init__(self, depth: int = 0, stops: tuple[str, ...] = (), colons: int = 0, record: bool = True) -> None:
        self._mode = _M.CONTAINER if depth > 0 else _M.BEFORE
        self._depth = depth
        self._escape = False
        self._scalar = False
        self._stops = stops
        self._stop_first = "".join(sorted({m[0] for m in stops if m}))
        self._skips = _SKIPS.get(self._stop_first) or _SKIPS.setdefault(self._stop_first, _Skips(self._stop_first))
        self.colons = colons
        self._record = record
        self._parts: list[str] = []

    @property
    def done(self) -> bool:
        return self._mode is _M.DONE

    @property
    def is_scalar(self) -> bool:
        """A number / true / false / null: its end is only known at the next character, so it is not streamed."""
        return self._scalar

    def close(self) -> None:
        """End of input: a number / literal still being read is complete."""
        if self._mode is _M.SCALAR:
            self._mode = _M.DONE

    def text(self) -> str:
        """The value's text recorded so far."""
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def take(self) -> str:
        """The value's text recorded since the last ``take``."""
        out = self.text()
        self._parts = []
        return out

    def scan(self, buf: str, i: int = 0, *, final: bool = False) -> tuple[int, Scan]:
        """Consume ``buf`` from ``i``; returns where it stopped and why."""
        n = len(buf)
        kept = -1 if self._mode is _M.BEFORE else i    # where this call's part of the value's text begins
        status = Scan.MORE
        while i < n:
            mode = self._mode
            if mode is _M.STRING:
                if self._escape:
                    self._escape, i = False, i + 1
                    continue
                i = run_end(_STRING_BODY, buf, i)
                if i == n:
                    break
                i += 1
                if buf[i - 1] == "\\":  # a lone backslash ends the input: the escaped character comes next
                    self._escape = True
                elif self._depth == 0:
                    self._mode, status = _M.DONE, Scan.DONE
                    break
                else:
                    self._mode = _M.CONTAINER
                continue
            skip = self._skips.space if mode is _M.BEFORE else self._skips.scalar if mode is _M.SCALAR else (
                self._skips.container_colon if self.colons and self._depth == 1 else self._skips.container)
            i = run_end(skip, buf, i)
            if i == n:
                break
            c = buf[i]
            if c in self._stop_first:
                stop = self._at_stop(buf, i, final)
                if stop is not None:
                    status = stop
                    break
            if mode is _M.SCALAR:
                if c in _SCALAR_END:
                    self._mode, status = _M.DONE, Scan.DONE
                    break
                i += 1
            elif mode is _M.BEFORE:
                kept, i = i, i + 1
                if c in "{[":
                    self._mode, self._depth = _M.CONTAINER, 1
                elif c == '"':
                    self._mode = _M.STRING
                else:
                    self._mode, self._scalar = _M.SCALAR, True
            elif c == '"':
                self._mode, i = _M.STRING, i + 1
            elif c in "{[":
                end = run_end(_OPENERS, buf, i)
                self._depth, i = self._depth + end - i, end
            elif c in "}]":
                self._depth, i = self._depth - 1, i + 1
                if self._depth == 0:
                    self._mode, status = _M.DONE, Scan.DONE
                    break
            elif c == ":" and self.colons and self._depth == 1:
                self.colons, i, status = self.colons - 1, i + 1, Scan.COLON
                break
            else:
                i += 1  # a stop's first character that begins no stop
        if self._record and 0 <= kept < i:
            self._parts.append(buf[kept:i])
        return i, status

    def _at_stop(self, buf: str, i: int, final: bool) -> Scan | None:
        if any(buf.startswith(m, i) for m in self._stops):
            return Scan.STOP
        if not final:
            rest = buf[i:i + 64]
            if any(m.startswith(rest) for m in self._stops):
                return Scan.MORE  # maybe a stop marker: wait for more
        return None
