"""Pathological model output for every registered parser, and a timer that feeds it token-sized.

Shared by ``bench/parser_adversarial.py`` (ms per MB, 10 KB .. 1 MB) and ``test_parser_linearity.py``
(the same inputs, smaller). An input is a ``prefix`` that steers the parser into one state (inside an
argument string, a header, an object without a name, ...) followed by a ``unit`` repeated to the size:
output that never resolves, so a parser that rescans what it holds on every feed goes quadratic.

Parsers registered under several names with equal formats (``qwen3`` and ``basic``, ``hermes`` and
``qwen25``) are one ``Subject`` with aliases: the same code on the same data.
"""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.parse.parsers.base import OutputParser
from services.parse.parsers.reasoning import REASONING_FORMATS
from services.parse.parsers.registry import REASONING_MARKERS, REASONING_PARSERS, TOOL_MARKERS, TOOL_PARSERS
from services.parse.parsers.tool_core import ParserContext
from services.parse.parsers.tool_formats import TOOL_FORMATS
from tests.parse.families import FAMILIES, harmony_reasoning, tagged_reasoning

SCHEMAS: dict[str, Any] = {"f": {"type": "object", "properties": {"s": {"type": "string"}, "o": {"type": "object"}}}}
PROSE = "The quick brown fox jumps over the lazy dog; then it rests. "


@dataclass(frozen=True)
class Subject:
    """One parser (``kind`` "reasoning" or "tool") and the inputs it is timed on: case -> (prefix, unit)."""

    kind: str
    name: str
    aliases: tuple[str, ...]
    factory: Callable[[ParserContext], OutputParser]
    cases: dict[str, tuple[str, str]]


def _cut(text: str, mark: str) -> str:
    return text[: text.index(mark)]


def tool_cases(name: str) -> dict[str, tuple[str, str]]:
    """Inputs for tool parser ``name``: every state a call can be left open in, and floods of its markers."""
    fam = FAMILIES[name]
    string_arg = _cut(fam.calls([("f", {"s": "QQQ"})]), "QQQ")       # inside an open string argument
    value_arg = _cut(fam.calls([("f", {"o": 12345.5})]), "12345.5")    # where a non-string value starts
    name_at = _cut(fam.calls([("zqzq", {})]), "zqzq")                   # inside the function's name
    section = TOOL_FORMATS[name].sections[0][0] if name in TOOL_FORMATS else "["
    markers = "".join(TOOL_MARKERS[name]) or "[f(), <|python_start|>"
    return {
        "text": ("", PROSE),
        "spaces": ("", " \n "),
        "markers": ("", markers),
        "name": (name_at, 'n\\"' if name_at.endswith('"') else "n"),  # an escaped-quote run in a JSON name
        "arg_string": (string_arg, '\\"'),
        "arg_object": (value_arg + "{", '"k": [1, "v"], '),
        "arg_deep": (value_arg, "["),
        "arg_number": (value_arg, "1"),
        "section_text": (section, "not a call, just words "),
        "object_open": (section + "{", '"k": "v", '),
        "object_deep": (section, "{"),
    }


def reasoning_cases(name: str) -> dict[str, tuple[str, str]]:
    """Inputs for reasoning parser ``name``: long reasoning, floods of whole and half markers."""
    write = harmony_reasoning if name == "gpt_oss" else tagged_reasoning(name) if name in REASONING_FORMATS else str
    markers = REASONING_MARKERS[name] or ("<think>", "</think>")
    cases = {
        "text": ("", PROSE),
        "spaces": ("", " \n "),
        "reasoning": (_cut(write("QQQ"), "QQQ"), PROSE),
        "markers": ("", "".join(markers)),
        "half_markers": ("", "".join(m[:-1] + " " for m in markers)),
    }
    if name == "gpt_oss":
        cases["header"] = ("<|channel|>", "analysis ")
        cases["tool_body"] = ("<|channel|>commentary to=functions.f <|constrain|>json<|message|>", '{"a": "\\"')
    return cases


def _distinct(names: list[str], key: Callable[[str], object]) -> list[tuple[str, tuple[str, ...]]]:
    groups: dict[object, list[str]] = {}
    for name in names:
        groups.setdefault(key(name), []).append(name)
    return [(group[0], tuple(group[1:])) for group in groups.values()]


def subjects() -> list[Subject]:
    """Every registered reasoning and tool parser, aliases folded into the first name."""
    out: list[Subject] = []
    for name, aliases in _distinct(list(REASONING_PARSERS), lambda n: REASONING_FORMATS.get(n, n)):
        out.append(Subject("reasoning", name, aliases, REASONING_PARSERS[name], reasoning_cases(name)))
    for name, aliases in _distinct(list(TOOL_PARSERS), lambda n: TOOL_FORMATS.get(n, n)):
        out.append(Subject("tool", name, aliases, TOOL_PARSERS[name], tool_cases(name)))
    return out


def build(prefix: str, unit: str, size: int) -> str:
    """``prefix`` then ``unit`` repeated: ``size`` characters."""
    return (prefix + unit * (size // len(unit) + 1))[:size]


def time_feed(factory: Callable[[ParserContext], OutputParser], text: str, chunk: int, limit_s: float) -> float:
    """Seconds to feed ``text`` ``chunk`` characters at a time, then finish; ``inf`` past ``limit_s``."""
    ids = (f"call_{i}" for i in itertools.count())
    parser = factory(ParserContext("", lambda: next(ids), SCHEMAS))
    pieces = [text[i:i + chunk] for i in range(0, len(text), chunk)]
    enabled = gc.isenabled()
    gc.disable()  # a collection's cost depends on the whole process, not on the parser
    try:
        started = time.perf_counter()
        for n, piece in enumerate(pieces):
            parser.feed(piece)
            if n % 512 == 511 and time.perf_counter() - started > limit_s:
                return float("inf")
        parser.finish()
        return time.perf_counter() - started
    finally:
        if enabled:
            gc.enable()
