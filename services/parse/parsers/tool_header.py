"""What must follow a tool section's start marker for the marker to open a call: each format's header, as data.

A start marker is text until the grammar says otherwise (a model that writes ``"<tool_call>"`` in prose
is not calling a tool). ``HeaderProbe`` decides from the text right after the marker: a call header
(``{"name"``, ``[{"name"``, the format's ``call_start`` such as ``<function=``, or for formats whose
header is a bare name, the name and what ends it) opens the section; anything that cannot begin one
makes the marker text. The probe reads at most ``LIMIT`` characters, so what a parser holds back while
it waits is bounded by the marker plus that, never by the rest of the stream.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from services.parse.parsers.base import run_end
from services.parse.parsers.tool_formats import ToolFormat

LIMIT = 160  # characters after the marker: whitespace, a function name (at most 64 in OpenAI's API) and a literal
_SPACE = re.compile(r"\s*")
_NAME = re.compile(r"[^\s\[<>\"\U000F0000-\U000FFFFF]*")  # as the tool machine reads a header's name

WS, NAME = "ws", "name"
Step = tuple[str, tuple[str, ...]]  # (WS | NAME | "lit", literal alternatives)


def _lit(*options: str) -> Step:
    return "lit", tuple(o for o in options if o)


_JSON: tuple[tuple[Step, ...], ...] = (
    ((WS, ()), _lit("{"), (WS, ()), _lit('"name"', '"arguments"', '"parameters"')),
    ((WS, ()), _lit("["), (WS, ()), _lit("{"), (WS, ()), _lit('"name"', '"arguments"', '"parameters"')),
)


def header_patterns(fmt: ToolFormat) -> tuple[tuple[Step, ...], ...]:
    """The ways a call may open right after one of ``fmt``'s section start markers (``fmt`` remapped)."""
    patterns = list(_JSON)
    if fmt.call_start:
        patterns.append(((WS, ()), _lit(fmt.call_start)))
    elif fmt.name_after:  # Harmony: the header names the recipient (``commentary to=functions.x``)
        patterns.append(((WS, ()), _lit(fmt.name_after)))
        patterns.append(((WS, ()), (NAME, ()), (WS, ()), _lit(fmt.name_after)))
    elif fmt.header_ends:  # a bare name, then what ends it (``[ARGS]``, ``<arg_key>``, ``</tool_call>``)
        ends = [e for e in (*fmt.header_ends, *fmt.header_marks) if e.strip()]
        if fmt.params:
            ends.append(fmt.params.open)
        patterns.append(((WS, ()), (NAME, ()), (WS, ()), _lit(*ends)))
    return tuple(patterns)


def _match(pattern: Sequence[Step], text: str) -> bool | None:
    """True when ``text`` begins with ``pattern``, None while it is a proper prefix of a match, else False."""
    i, n = 0, len(text)
    for kind, options in pattern:
        if kind == WS:
            i = run_end(_SPACE, text, i)
        elif kind == NAME:
            j = run_end(_NAME, text, i)
            if j == i:
                return None if i == n else False
            i = j
        else:
            if any(text.startswith(o, i) for o in options):
                i += len(next(o for o in options if text.startswith(o, i)))
                continue
            if any(n - i < len(o) and o.startswith(text[i:]) for o in options):
                return None
            return False
        if i == n:
            return None
    return True


class HeaderProbe:
    """Decides whether the text after a section start marker opens a call (see the module docstring)."""

    def __init__(self, fmt: ToolFormat) -> None:
        self._patterns = header_patterns(fmt)

    def decide(self, text: str, *, final: bool) -> bool | None:
        """True: a call; False: the marker is text; None: undecided (wait for more)."""
        head = text[:LIMIT]
        results = [_match(p, head) for p in self._patterns]
        if True in results:
            return True
        if None in results and not final and len(text) < LIMIT:
            return None
        return False
