"""The public names of the output parsers (they are API: settings and flags use them).

Names are Dynamo's and vLLM's. Each entry builds a parser for one stream from a ``ParserContext``;
``*_MARKERS`` list the marker texts each parser matches (the pipeline matches those by token id when
the tokenizer has them as single tokens).
"""

from __future__ import annotations

from collections.abc import Callable

from services.parse.parsers.base import OutputParser
from services.parse.parsers.harmony import HARMONY_MARKERS, HarmonyReasoningParser
from services.parse.parsers.pythonic import PythonicToolParser
from services.parse.parsers.reasoning import (
    REASONING_FORMATS,
    AppendThinkParser,
    TaggedReasoningParser,
    append_think_opener,
)
from services.parse.parsers.tool_core import ParserContext
from services.parse.parsers.tool_formats import TOOL_FORMATS, ToolFormat
from services.parse.parsers.tool_machine import MarkedToolParser

ParserFactory = Callable[[ParserContext], OutputParser]


def _tagged(name: str) -> ParserFactory:
    fmt = REASONING_FORMATS[name]
    return lambda ctx: TaggedReasoningParser.for_prompt(fmt, ctx.prompt, ctx.marker)


def _marked(fmt: ToolFormat) -> ParserFactory:
    return lambda ctx: MarkedToolParser(fmt, ctx)


REASONING_PARSERS: dict[str, ParserFactory] = {
    **{name: _tagged(name) for name in REASONING_FORMATS},
    "minimax_append_think": lambda ctx: AppendThinkParser(append_think_opener(ctx.prompt)),
    "gpt_oss": lambda ctx: HarmonyReasoningParser(ctx.marker),
}

TOOL_PARSERS: dict[str, ParserFactory] = {
    **{name: _marked(fmt) for name, fmt in TOOL_FORMATS.items()},
    "pythonic": PythonicToolParser,
}

REASONING_MARKERS: dict[str, tuple[str, ...]] = {
    **{name: fmt.markers for name, fmt in REASONING_FORMATS.items()},
    "minimax_append_think": (),
    "gpt_oss": HARMONY_MARKERS,
}

TOOL_MARKERS: dict[str, tuple[str, ...]] = {
    **{name: fmt.markers for name, fmt in TOOL_FORMATS.items()},
    "pythonic": (),
}


class UnknownParserError(ValueError):
    """A parser name that is not registered."""


def reasoning_parser_factory(name: str) -> ParserFactory:
    """The factory registered as ``name``; raises UnknownParserError listing the valid names."""
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise UnknownParserError(
            f"unknown reasoning parser {name!r}; valid names: {', '.join(sorted(REASONING_PARSERS))}"
        ) from None


def tool_parser_factory(name: str) -> ParserFactory:
    """The factory registered as ``name``; raises UnknownParserError listing the valid names."""
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise UnknownParserError(
            f"unknown tool parser {name!r}; valid names: {', '.join(sorted(TOOL_PARSERS))}"
        ) from None


def replay_markers(name: str) -> tuple[str, str] | None:
    """(open, close) a reasoning block is re-inserted with for reasoning parser ``name`` (None: no markers)."""
    fmt = REASONING_FORMATS.get(name)
    if fmt is None:
        return None
    return fmt.starts[0] + fmt.inner, fmt.inner + fmt.ends[0] + fmt.separator
