"""The family table's marker section (issue 34): a tool format's markers are text until its grammar says otherwise.

For every tool parser (with its paired reasoning parser): a literal start marker in prose before a real
call, in a Markdown code fence, in reasoning, at the very end of a turn with no call, split across
tokens, and closers inside argument values. Each case checks the exact text (markers kept), the exact
calls and the finish reason, whole, per character, in random chunks and split inside every marker; and
measures the largest hold-back in characters: how much of the input, fed per character, had not yet
reached the client as text or reasoning although it would have if the stream had ended there.
``python -m tests.parse.test_marker_families`` prints the table (docs/parsers.md carries it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from services.parse.parsers.events import Event, ReasoningDelta, TextDelta, ToolCallDispatch
from services.parse.parsers.registry import REASONING_PARSERS, TOOL_PARSERS
from services.parse.parsers.tool_core import ParserContext
from services.parse.parsers.tool_formats import TOOL_FORMATS
from services.parse.parsers.tool_header import LIMIT
from tests.parse.families import FAMILIES, Call, Family
from tests.parse.support import REPO
from tests.parse.test_families import SCHEMAS, WEATHER, calls_of, random_chunks, run

R, T = ReasoningDelta, TextDelta
Case = tuple[str, list[Event]]


def start_marker(family: str) -> str:
    """The literal a model would quote: the format's (first) section start marker."""
    if family == "pythonic":
        return "<|python_start|>"
    return TOOL_FORMATS[family].sections[0][0]


def closers(family: str) -> list[str]:
    """Text that looks like the end of a value, a call or a section in this format."""
    if family == "pythonic":
        return [")", "]", "<|python_end|>"]
    fmt = TOOL_FORMATS[family]
    found = [fmt.call_end, *(end for _, end in fmt.sections), fmt.params.value_end if fmt.params else ""]
    # Harmony's <|call|> ends the message at the reasoning parser: a grammar boundary, never value text
    return [m for m in found if m and m != "<|call|>"] or ["}", "]"]


def _calls_after_text(f: Family, calls: list[Call]) -> Case:
    """A real call as the model writes it after some text."""
    text, events = calls_of(f, calls)
    if f.tool_parser == "llama3_json":  # a bare JSON call only opens the output; after text it needs the tag
        text = "<|python_tag|>" + text
    return text, events


def prose_before_call(f: Family) -> Case:
    m = start_marker(f.tool_parser)
    prose = f'The literal token "{m}" opens a call in this format. Now a real one:'
    calls, events = calls_of(f, [WEATHER]) if f.tool_parser == "pythonic" else _calls_after_text(f, [WEATHER])
    if f.tool_parser == "pythonic":  # a pythonic call list must open the output: the prose follows it
        return calls + f.text(" " + prose), [*events, T(prose)]  # the space after the list is its separator
    return f.text(prose) + calls, [T(prose), *events]


def in_code_fence(f: Family) -> Case:
    m = start_marker(f.tool_parser)
    fence = f"Calls look like this:\n```\n{m}\n```\nand here is one:"
    if f.tool_parser == "pythonic":
        calls, events = calls_of(f, [WEATHER])
        return calls + f.text(" " + fence), [*events, T(fence)]
    calls, events = _calls_after_text(f, [WEATHER])
    return f.text(fence) + calls, [T(fence), *events]


def in_reasoning(f: Family) -> Case:
    m = start_marker(f.tool_parser)
    thought = f"I could write {m} here, but not yet."
    return f.reasoning(thought) + f.text("Done."), [R(thought), T("Done.")]


def at_the_end(f: Family) -> Case:
    m = start_marker(f.tool_parser)
    text = f"Answer: the call marker is {m}"
    return f.text(text), [T(text)]


def closers_in_values(f: Family) -> Case:
    note = "a " + " b ".join(closers(f.tool_parser)) + " c"
    return calls_of(f, [("get_weather", {"city": "Paris", "note": note})])


CASES: dict[str, Callable[[Family], Case]] = {
    "prose_before_call": prose_before_call,
    "in_code_fence": in_code_fence,
    "in_reasoning": in_reasoning,
    "at_the_end_no_call": at_the_end,
    "closers_in_values": closers_in_values,
}


def split_in_markers(text: str, markers: Sequence[str]) -> list[str]:
    """``text`` cut in the middle of every occurrence of each of ``markers`` (a marker split across tokens)."""
    cuts = sorted({at + len(m) // 2 for m in markers if len(m) > 1 for at in _find_all(text, m)})
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def _find_all(text: str, sub: str) -> list[int]:
    out, at = [], text.find(sub)
    while at >= 0:
        out.append(at)
        at = text.find(sub, at + 1)
    return out


def visible(events: Sequence[Event]) -> int:
    return sum(len(e.text) for e in events if isinstance(e, TextDelta | ReasoningDelta))


def hold_back(f: Family, text: str) -> int:
    """The most characters, fed one at a time, that were shown later than a stream ending there would show them."""
    ctx = ParserContext(f.prompt, schemas=SCHEMAS)
    reasoning, tools = REASONING_PARSERS[f.reasoning_parser](ctx), TOOL_PARSERS[f.tool_parser](ctx)
    shown, worst = 0, 0
    for i, c in enumerate(text, 1):
        for e in reasoning.feed(c):
            shown += visible(tools.feed(e.text)) if isinstance(e, TextDelta) else visible([e])
        worst = max(worst, visible(run(f, [text[:i]])) - shown)
    return worst


def finish_reason(events: Sequence[Event]) -> str:
    """As the parse service sets it (convert.finish_events) for a stream that ended normally."""
    return "tool_calls" if any(isinstance(e, ToolCallDispatch) for e in events) else "stop"


WITH_CALLS = ("prose_before_call", "in_code_fence", "closers_in_values")


def hold_back_bound(family: str, case: str) -> int:
    """The start marker plus half a reasoning / framing closer (``</think>``, ``<|return|>``) before the grammar
    can tell; in a turn with a call, a call header's worth more (``tool_header.LIMIT``)."""
    return len(start_marker(family)) + len("<|return|>") + (LIMIT if case in WITH_CALLS else 0)


def table() -> list[dict[str, Any]]:
    rows = []
    for family in sorted(FAMILIES):
        fam = FAMILIES[family]
        for case, build in CASES.items():
            text, expected = build(fam)
            rows.append({"family": family, "case": case, "calls": sum(isinstance(e, ToolCallDispatch)
                                                                       for e in expected),
                         "finish": finish_reason(expected), "hold_back": hold_back(fam, text)})
    return rows


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_markers_are_text_until_the_grammar_says_otherwise(family: str, case: str) -> None:
    fam = FAMILIES[family]
    text, expected = CASES[case](fam)
    assert case == "closers_in_values" or start_marker(family) in text
    split = split_in_markers(text, [start_marker(family), *closers(family)])
    for pieces in ([text], list(text), split, *(random_chunks(text, seed) for seed in range(3))):
        assert run(fam, pieces) == expected, pieces
    assert finish_reason(run(fam, [text])) == ("tool_calls" if case in WITH_CALLS else "stop")
    held = hold_back(fam, text)
    assert held <= hold_back_bound(family, case)
    assert DOCS_TABLE[family, case] == (str(len([e for e in expected if isinstance(e, ToolCallDispatch)])),
                                        finish_reason(expected), str(held))


def _docs_table() -> dict[tuple[str, str], tuple[str, ...]]:
    rows = {}
    for line in (REPO / "docs" / "parsers.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[1] in CASES:
            rows[cells[0], cells[1]] = tuple(cells[2:])
    return rows


DOCS_TABLE = _docs_table()


if __name__ == "__main__":
    print("| family | case | calls | finish | hold-back (chars) |")
    print("|---|---|---|---|---|")
    for row in table():
        print(f"| {row['family']} | {row['case']} | {row['calls']} | {row['finish']} | {row['hold_back']} |")
