"""The public names of the output parsers (they are API: settings and flags use them)."""

from __future__ import annotations

from collections.abc import Callable

from services.parse.parsers.base import OutputParser
from services.parse.parsers.reasoning import qwen3_reasoning_parser
from services.parse.parsers.tool_calls import hermes_tool_parser

# prompt text -> a parser for one stream (the prompt tells whether generation starts inside reasoning)
ReasoningParserFactory = Callable[[str], OutputParser]
# tool call id generator -> a parser for one stream
ToolParserFactory = Callable[[Callable[[], str]], OutputParser]

REASONING_PARSERS: dict[str, ReasoningParserFactory] = {
    "qwen3": qwen3_reasoning_parser,
}

TOOL_PARSERS: dict[str, ToolParserFactory] = {
    "hermes": hermes_tool_parser,
}


class UnknownParserError(ValueError):
    """A parser name that is not registered."""


def reasoning_parser_factory(name: str) -> ReasoningParserFactory:
    """The factory registered as ``name``; raises UnknownParserError listing the valid names."""
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise UnknownParserError(
            f"unknown reasoning parser {name!r}; valid names: {', '.join(sorted(REASONING_PARSERS))}"
        ) from None


def tool_parser_factory(name: str) -> ToolParserFactory:
    """The factory registered as ``name``; raises UnknownParserError listing the valid names."""
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise UnknownParserError(
            f"unknown tool parser {name!r}; valid names: {', '.join(sorted(TOOL_PARSERS))}"
        ) from None
