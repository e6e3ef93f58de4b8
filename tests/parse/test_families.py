"""The per-family case table: every tool format (with its paired reasoning parser) and every reasoning format.

Each case runs whole, per character, in random multi-character chunks, and split at random points by
hypothesis; all must produce the same events.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.parse.parsers.events import (
    Event,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallDispatch,
    ToolCallStart,
)
from services.parse.parsers.reasoning import REASONING_FORMATS
from services.parse.parsers.registry import REASONING_PARSERS, TOOL_MARKERS, TOOL_PARSERS
from services.parse.parsers.tool_core import ParserContext
from tests.parse.families import FAMILIES, Call, Family, dumps
from tests.parse.support import run_parsers

R, T = ReasoningDelta, TextDelta
SCHEMAS: dict[str, Any] = {
    "get_weather": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "note": {"type": "string"},
        "opts": {"type": "object"}}},
    "noop": {"type": "object", "properties": {}},
}
WEATHER: Call = ("get_weather", {"city": "Paris", "days": 3})
LYON: Call = ("get_weather", {"city": "Lyon", "days": 1})
UNICODE: Call = ("get_weather", {"city": "Zürich 日本 🙂", "note": 'say "hi" \\ back </x>'})
NESTED: Call = ("get_weather", {"city": "Lyon", "opts": {"units": {"temp": "c"}, "list": [1, 2.5, {"a": None}]}})
EMPTY: Call = ("noop", {})


def run(fam: Family, pieces: Sequence[str], prompt: str | None = None) -> list[Event]:
    ids = (f"call_{i}" for i in itertools.count())
    ctx = ParserContext(fam.prompt if prompt is None else prompt, lambda: next(ids), SCHEMAS)
    return run_parsers(REASONING_PARSERS[fam.reasoning_parser](ctx), TOOL_PARSERS[fam.tool_parser](ctx), pieces)


def call_events(fam: Family, index: int, call: Call) -> list[Event]:
    name, args = call
    cid = fam.call_ids(index, name) if fam.call_ids else f"call_{index}"
    return [ToolCallStart(index, cid, name), ToolCallArgumentsDelta(index, cid, dumps(args)),
            ToolCallDispatch(index, cid, name, dumps(args))]


def calls_of(fam: Family, calls: list[Call], first: int = 0) -> tuple[str, list[Event]]:
    expected = [e for i, c in enumerate(calls, first) for e in call_events(fam, i, c)]
    return fam.calls(calls, first), expected


Case = Callable[[Family], tuple[str, list[Event]]]


def _interleaved(f: Family) -> tuple[str, list[Event]]:
    one, e1 = calls_of(f, [WEATHER])
    two, e2 = calls_of(f, [LYON], 1)
    return f.reasoning("Paris first.") + one + f.reasoning("Now Lyon.") + two, [
        R("Paris first."), *e1, R("Now Lyon."), *e2]


def _text_around(f: Family) -> tuple[str, list[Event]]:
    text, events = calls_of(f, [WEATHER])
    before = [f.text("Checking.")] if f.text_before_calls else []
    return "".join(before) + text + f.text("Done."), [*([T("Checking.")] if before else []), *events, T("Done.")]


CASES: dict[str, Case] = {
    "no_reasoning": lambda f: (f.text("Hello there."), [T("Hello there.")]),
    "reasoning_only": lambda f: (f.reasoning("Just thinking."), [R("Just thinking.")]),
    "reasoning_then_text": lambda f: (f.reasoning("Hmm.") + f.text("Paris."), [R("Hmm."), T("Paris.")]),
    "reasoning_tool_reasoning_tool": _interleaved,
    "parallel_calls": lambda f: calls_of(f, [WEATHER, LYON, EMPTY]),
    "text_around_calls": _text_around,
    "unicode_and_escaped_quotes": lambda f: calls_of(f, [UNICODE]),
    "nested_json": lambda f: calls_of(f, [NESTED]),
    "empty_arguments": lambda f: calls_of(f, [EMPTY]),
}


def random_chunks(text: str, seed: int) -> list[str]:
    rng, out, i = random.Random(seed), [], 0
    while i < len(text):
        n = rng.randint(1, 7)
        out.append(text[i:i + n])
        i += n
    return out


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_case_whole_per_character_and_random_chunks(family: str, case: str) -> None:
    fam = FAMILIES[family]
    text, expected = CASES[case](fam)
    assert run(fam, [text]) == expected
    assert run(fam, list(text)) == expected
    for seed in range(4):
        assert run(fam, random_chunks(text, seed)) == expected


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_marker_split_across_three_chunks(family: str) -> None:
    fam = FAMILIES[family]
    text, expected = calls_of(fam, [WEATHER])
    at = next(i for i, c in enumerate(text) if not c.isalnum() and c not in " \n") if text[0] != "[" else 0
    assert run(fam, [text[: at + 1], text[at + 1: at + 3], text[at + 3:]]) == expected


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_truncated_at_max_tokens(family: str) -> None:
    """Cut inside the second call's arguments: the first is dispatched, the second never; no marker leaks."""
    fam = FAMILIES[family]
    text, _ = calls_of(fam, [WEATHER, NESTED])
    cut = text.index('"units"') if '"units"' in text else text.index("units")
    for events in (run(fam, [text[:cut]]), run(fam, list(text[:cut]))):
        dispatched = [e for e in events if isinstance(e, ToolCallDispatch)]
        assert [(d.index, d.arguments_json) for d in dispatched] == [(0, dumps(WEATHER[1]))]
        visible = "".join(e.text for e in events if isinstance(e, TextDelta | ReasoningDelta))
        assert not any(m in visible for m in TOOL_MARKERS[family]), visible


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_property_any_split_gives_the_same_events(data: st.DataObject) -> None:
    fam = FAMILIES[data.draw(st.sampled_from(sorted(FAMILIES)))]
    text, expected = CASES[data.draw(st.sampled_from(sorted(CASES)))](fam)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    pieces = [text[a:b] for a, b in itertools.pairwise([0, *cuts, len(text)])]
    assert run(fam, pieces) == expected


# -- reasoning formats alone -------------------------------------------------------------------------

def _reasoning_cases(name: str) -> list[Any]:
    fmt = REASONING_FORMATS[name]
    open_, close = fmt.starts[0] + fmt.inner, fmt.inner + fmt.ends[0] + fmt.separator
    cases = [
        ("text_only", "", "Plain answer.", [T("Plain answer.")]),
        ("reasoning_and_text", "", open_ + "Think.\nMore." + close + "Answer.", [R("Think.\nMore."), T("Answer.")]),
        ("two_blocks", "", open_ + "a" + close + "b" + open_ + "c" + close + "d", [R("a"), T("b"), R("c"), T("d")]),
        ("unterminated", "", open_ + "cut off", [R("cut off")]),
        ("prompt_opened", "PROMPT" + fmt.starts[0], fmt.inner + "inside" + close + "out", [R("inside"), T("out")]),
    ]
    # Forced-reasoning audit (docs/parsers.md): a prompt that closed the block means thinking is off;
    # a forced family starts in reasoning otherwise, even after closed blocks earlier in the prompt.
    cases.append(("prompt_closed", "PROMPT" + open_ + close, "Plain answer.", [T("Plain answer.")]))
    if fmt.forced:
        cases.append(("forced_without_opener", "", "straight in" + close + "out", [R("straight in"), T("out")]))
        cases.append(("forced_after_history", "Q" + open_ + "old" + close + "A\nQ2\n", "in" + close + "out",
                      [R("in"), T("out")]))
        cases.remove(cases[0])
    elif fmt.drop_stray_ends:
        cases.append(("stray_closer_dropped", "", "before" + fmt.ends[0] + "after", [T("beforeafter")]))
    return [pytest.param(name, *c[1:], id=f"{name}-{c[0]}") for c in cases]


@pytest.mark.parametrize(("name", "prompt", "text", "expected"),
                         [c for n in sorted(REASONING_FORMATS) for c in _reasoning_cases(n)])
def test_reasoning_format(name: str, prompt: str, text: str, expected: list[Event]) -> None:
    fam = Family("hermes", name, lambda t: t)
    for pieces in ([text], list(text), random_chunks(text, 1), random_chunks(text, 2)):
        assert run(fam, pieces, prompt) == expected


def test_minimax_append_think_restores_the_opener() -> None:
    fam = Family("hermes", "minimax_append_think", lambda t: t)
    assert run(fam, list("idea\n</think>\n\nok"), "]~b]ai\n<think>\n") == [T("<think>\nidea\n</think>\n\nok")]
    assert run(fam, list("idea</think>ok"), "]~b]ai\n") == [T("<think>idea</think>ok")]   # as vLLM: always
    assert run(fam, list("ok"), "]~b]ai\n<think>\n\n</think>\n\n") == [T("ok")]       # thinking off


def test_gpt_oss_without_framing_is_text_and_half_headers_never_leak() -> None:
    fam = FAMILIES["harmony"]
    assert run(fam, ["just text"]) == [T("just text")]
    assert run(fam, ["<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>fin"]) == [R("x")]


def test_kimi_k25_tool_section_ends_reasoning() -> None:
    fam = FAMILIES["kimi_k2"]
    text, events = calls_of(fam, [WEATHER])
    assert run(fam, ["<think>\nno closer " + text]) == [R("no closer "), *events]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_dispatch_fires_while_decoding_not_at_the_end(family: str) -> None:
    """Every call is dispatched by ``feed`` — also in formats with no end marker — never only by ``finish``."""
    fam = FAMILIES[family]
    text, _ = calls_of(fam, [WEATHER, LYON])
    ids = (f"call_{i}" for i in itertools.count())
    ctx = ParserContext(fam.prompt, lambda: next(ids), SCHEMAS)
    reasoning, tools = REASONING_PARSERS[fam.reasoning_parser](ctx), TOOL_PARSERS[fam.tool_parser](ctx)
    fed: list[Event] = []
    for c in text:
        for e in reasoning.feed(c):
            fed += tools.feed(e.text) if isinstance(e, TextDelta) else [e]
    assert [e.index for e in fed if isinstance(e, ToolCallDispatch)] == [0, 1]
