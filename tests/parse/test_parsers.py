"""Output parsers: every case run whole, per token, per character and in random chunks; all must agree."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Sequence

import pytest

from services.common.model_dir import load_model_dir
from services.parse.parsers.events import (
    Event,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallDispatch,
    ToolCallStart,
    merge_deltas,
)
from services.parse.parsers.pipeline import IncrementalDetokenizer, MarkerIds, OutputPipeline
from services.parse.parsers.registry import (
    REASONING_MARKERS,
    REASONING_PARSERS,
    TOOL_MARKERS,
    TOOL_PARSERS,
    UnknownParserError,
    reasoning_parser_factory,
    tool_parser_factory,
)
from services.parse.parsers.tool_core import ParserContext, new_tool_call_id
from tests.parse.support import run_parsers

DEMO = load_model_dir(None)
R, T = ReasoningDelta, TextDelta
W_ARGS = '{"city": "Paris", "units": {"temp": "c"}, "note": "a } b \\" </tool_call> {"}'


def call(index: int, name: str, args: str) -> list[Event]:
    cid = f"call_{index}"
    return [ToolCallStart(index, cid, name), ToolCallArgumentsDelta(index, cid, args),
            ToolCallDispatch(index, cid, name, args)]


def tc(name: str, args: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


# (id, prompt, model output, expected merged events); qwen3 reasoning + hermes tools.
CASES: list[tuple[str, str, str, list[Event]]] = [
    ("plain_text", "", "Hello there.", [T("Hello there.")]),
    ("reasoning_then_text", "", "<think>\nLet me think.\n</think>\n\nParis.", [R("Let me think."), T("Paris.")]),
    ("prompt_opened_think", "<|im_start|>assistant\n<think>\n", "Hmm.\n</think>\n\nOK", [R("Hmm."), T("OK")]),
    ("prompt_closed_think", "<think>\n\n</think>\n\n", "Just text", [T("Just text")]),
    ("unclosed_reasoning", "", "<think>\nstill thinking", [R("still thinking")]),
    ("half_markers_are_text", "", "a <thi ng and <tool_ca ll> x < y", [T("a <thi ng and <tool_ca ll> x < y")]),
    ("multibyte", "", "<think>\nünï 日本 🙂\n</think>\n\nçà 😀", [R("ünï 日本 🙂"), T("çà 😀")]),
    ("reasoning_tool_call", "", "<think>\nNeed weather.\n</think>\n\n" + tc("get_weather", W_ARGS),
     [R("Need weather."), *call(0, "get_weather", W_ARGS)]),
    ("text_then_parallel_calls", "", "Sure.\n" + tc("a", '{"x": 1}') + "\n" + tc("b", "{}"),
     [T("Sure."), *call(0, "a", '{"x": 1}'), *call(1, "b", "{}")]),
    ("separators_after_calls_dropped_but_text_kept", "", tc("a", "{}") + "\n\n", call(0, "a", "{}")),
    ("plain_text_keeps_trailing_space", "", "Done. \n", [T("Done. \n")]),
    ("broken_call_is_text_with_its_markers", "", "ok <tool_call>\nnot json\n</tool_call>",
     [T("ok <tool_call>\nnot json\n</tool_call>")]),
    ("interleaved_reasoning", "",
     "<think>\nfirst\n</think>\n\n" + tc("a", '{"k": [1, 2]}') + "<think>\nsecond\n</think>\n\n" + tc("b", '"s"'),
     [R("first"), *call(0, "a", '{"k": [1, 2]}'), R("second"), *call(1, "b", '"s"')]),
    ("scalar_arguments", "", tc("f", "12") + "done", [*call(0, "f", "12"), T("done")]),
    ("malformed_is_text", "", "<tool_call>\nnot json\n</tool_call>after",
     [T("<tool_call>\nnot json\n</tool_call>after")]),
    ("keys_reordered_whole_body", "", '<tool_call>\n{"arguments": {"q": "x"}, "name": "search"}\n</tool_call>',
     call(0, "search", '{"q": "x"}')),
    ("unterminated_header_is_text", "", 'ok <tool_call>\n{"name": "f", "argu', [T('ok {"name": "f", "argu')]),
    ("truncated_arguments_no_dispatch", "", '<tool_call>\n{"name": "f", "arguments": {"a": "lo',
     [ToolCallStart(0, "call_0", "f"), ToolCallArgumentsDelta(0, "call_0", '{"a": "lo')]),
]


def counter_ids() -> ParserContext:
    ids = (f"call_{i}" for i in itertools.count())
    return ParserContext(new_call_id=lambda: next(ids))


def pipeline(prompt: str) -> OutputPipeline:
    markers = MarkerIds(DEMO.tokenizer, REASONING_MARKERS["qwen3"] + TOOL_MARKERS["hermes"])
    ctx = dataclasses.replace(counter_ids(), prompt=prompt, marker=markers.marker)
    return OutputPipeline(
        IncrementalDetokenizer(DEMO.tokenizer, DEMO.eos_token_ids, markers),
        REASONING_PARSERS["qwen3"](ctx),
        TOOL_PARSERS["hermes"](ctx),
        markers,
    )


def run_tokens(prompt: str, chunks: Sequence[Sequence[int]]) -> list[Event]:
    p = pipeline(prompt)
    events: list[Event] = []
    for chunk in chunks:
        events += p.feed(chunk)
    return merge_deltas(events + p.finish())


def run_text(prompt: str, pieces: Sequence[str]) -> list[Event]:
    """The parsers alone on text pieces (markers are single demo tokens, so this is what splits them)."""
    ctx = dataclasses.replace(counter_ids(), prompt=prompt)
    return run_parsers(REASONING_PARSERS["qwen3"](ctx), TOOL_PARSERS["hermes"](ctx), pieces)


def random_chunks(items: Sequence[int] | str, seed: int) -> list[Sequence[int] | str]:
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(items):
        n = rng.randint(1, 6)
        out.append(items[i:i + n])
        i += n
    return out


@pytest.mark.parametrize(("prompt", "output", "expected"), [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_case_whole_per_token_and_random_chunks(prompt: str, output: str, expected: list[Event]) -> None:
    ids = [*DEMO.tokenizer.encode(output, add_special_tokens=False).ids, DEMO.eos_token_ids[0]]
    assert run_tokens(prompt, [ids]) == expected
    assert run_tokens(prompt, [[i] for i in ids]) == expected
    for seed in range(5):
        assert run_tokens(prompt, random_chunks(ids, seed)) == expected  # type: ignore[arg-type]
    assert run_text(prompt, [output]) == expected
    assert run_text(prompt, list(output)) == expected
    for seed in range(5):
        assert run_text(prompt, random_chunks(output, seed)) == expected  # type: ignore[arg-type]


def test_arguments_stream_and_dispatch_before_the_call_closes() -> None:
    parser = TOOL_PARSERS["hermes"](ParserContext(new_call_id=lambda: "call_x"))
    text = tc("get_weather", W_ARGS)
    body_end = text.index(W_ARGS) + len(W_ARGS)
    per_char = [parser.feed(c) for c in text[:body_end]]
    flat = [e for evs in per_char for e in evs]
    deltas = [e for e in flat if isinstance(e, ToolCallArgumentsDelta)]
    assert len(deltas) > 5  # streamed, not one blob
    assert "".join(d.delta for d in deltas) == W_ARGS
    assert flat[-1] == ToolCallDispatch(0, "call_x", "get_weather", W_ARGS)  # before "}\n</tool_call>" arrived
    start_at = next(i for i, evs in enumerate(per_char) if evs and isinstance(evs[0], ToolCallStart))
    assert start_at < text.index('"arguments"') + len('"arguments":')
    assert parser.feed(text[body_end:]) == []
    assert parser.finish() == []


def test_end_of_turn_text_is_never_emitted() -> None:
    ids = DEMO.tokenizer.encode("Done<|im_end|>", add_special_tokens=False).ids
    assert DEMO.eos_token_ids[0] in ids
    assert run_tokens("", [ids]) == [T("Done")]


def test_tool_call_ids_are_openai_style() -> None:
    cid = new_tool_call_id()
    assert cid.startswith("call_") and len(cid) == 29 and int(cid[5:], 16) >= 0
    assert cid != new_tool_call_id()


def test_registry_names_are_pinned() -> None:
    assert set(REASONING_PARSERS) == {
        "basic", "qwen3", "deepseek_r1", "deepseek_v3", "deepseek_v3_1", "nemotron_deci", "nemotron_nano",
        "nemotron3", "glm45", "kimi", "kimi_k25", "mistral", "granite", "minimax_m2", "minimax_append_think",
        "gpt_oss", "step3",
    }
    assert set(TOOL_PARSERS) == {
        "hermes", "qwen25", "qwen3_coder", "llama3_json", "mistral", "pythonic", "nemotron_deci", "phi4", "jamba",
        "deepseek_v3", "deepseek_v3_1", "deepseek_v3_2", "kimi_k2", "glm45", "glm47", "minimax_m2", "harmony",
        "default",
    }
    assert set(REASONING_MARKERS) == set(REASONING_PARSERS) and set(TOOL_MARKERS) == set(TOOL_PARSERS)


def test_unknown_parser_name_lists_valid_names() -> None:
    with pytest.raises(UnknownParserError, match=r"valid names: basic, deepseek_r1, .*qwen3, step3"):
        reasoning_parser_factory("deepseek")
    with pytest.raises(UnknownParserError, match=r"valid names: deepseek_v3, .*hermes, .*qwen3_coder"):
        tool_parser_factory("nope")


def test_markers_are_matched_by_token_id_not_by_look_alike_text() -> None:
    """``<think>`` is one token of the demo tokenizer: spelled out in pieces it is just text."""
    think = DEMO.tokenizer.token_to_id("<think>")
    spelled = [i for piece in ("<", "think", ">") for i in DEMO.tokenizer.encode(piece, add_special_tokens=False).ids]
    assert think is not None and think not in spelled
    rest = DEMO.tokenizer.encode("hi", add_special_tokens=False).ids
    assert run_tokens("", [spelled + rest]) == [T("<think>hi")]
    assert run_tokens("", [[think, *rest]]) == [R("hi")]


# Forced-reasoning audit (docs/parsers.md): (id, reasoning parser, prompt, output, expected). The model
# emits only the closer when its template opened the block; what happens when the prompt we see did not.
AUDIT: list[tuple[str, str, str, str, list[Event]]] = [
    ("deepseek_r1_silent_prompt", "deepseek_r1", "<｜Assistant｜>", "Hmm.\n</think>\n\nOK", [R("Hmm."), T("OK")]),  # noqa: RUF001
    ("deepseek_r1_thinking_off", "deepseek_r1", "<｜Assistant｜><think>\n\n</think>\n\n", "OK", [T("OK")]),  # noqa: RUF001
    ("deepseek_r1_writes_opener", "deepseek_r1", "", "<think>\nHmm.\n</think>\n\nOK", [R("Hmm."), T("OK")]),
    ("minimax_m2_silent_prompt", "minimax_m2", "]~b]ai\n", "idea\n</think>\n\nok", [R("idea"), T("ok")]),
    ("minimax_m2_after_history", "minimax_m2", "]~b]ai\n<think>\nold\n</think>\n\nA[e~[\n]~b]user\nQ[e~[\n]~b]ai\n",
     "idea\n</think>\n\nok", [R("idea"), T("ok")]),
    ("minimax_m2_prompt_opened", "minimax_m2", "]~b]ai\n<think>\n", "idea\n</think>\n\nok", [R("idea"), T("ok")]),
    ("minimax_m2_tool_section_ends_reasoning", "minimax_m2", "]~b]ai\n", 'idea\n<minimax:tool_call>\n<invoke name="x',
     [R("idea"), T('<minimax:tool_call>\n<invoke name="x')]),
    ("minimax_m2_tool_marker_in_prose_is_reasoning", "minimax_m2", "]~b]ai\n", "idea <minimax:tool_call> tag\n</think>",
     [R("idea <minimax:tool_call> tag")]),
    ("kimi_k25_silent_prompt", "kimi_k25", "<|im_assistant|>assistant<|im_middle|>", "plan</think>answer",
     [R("plan"), T("answer")]),
    ("kimi_k25_instant_mode", "kimi_k25", "<|im_middle|><think></think>", "answer", [T("answer")]),
    ("nemotron3_silent_prompt", "nemotron3", "<|im_start|>assistant\n", "plan\n</think>\n\nanswer",
     [R("plan"), T("answer")]),
    ("nemotron_nano_silent_prompt", "nemotron_nano", "", "plan\n</think>\n\nanswer", [R("plan"), T("answer")]),
    ("step3_silent_prompt", "step3", "", "plan\n</think>\n\nanswer", [R("plan"), T("answer")]),
    # Not forced (Dynamo's qwen3): the prompt decides; a stray closer is dropped, never streamed as text.
    ("qwen3_prompt_opened", "qwen3", "<|im_start|>assistant\n<think>\n", "Hmm.\n</think>\n\nOK", [R("Hmm."), T("OK")]),
    ("qwen3_silent_prompt_stray_closer", "qwen3", "<|im_start|>assistant\n", "Hmm.\n</think>\n\nOK",
     [T("Hmm.\n\n\nOK")]),
    ("qwen3_no_reasoning", "qwen3", "<|im_start|>assistant\n", "Just text.", [T("Just text.")]),
    ("append_think_silent_prompt", "minimax_append_think", "]~b]ai\n", "idea</think>ok", [T("<think>idea</think>ok")]),
    ("append_think_thinking_off", "minimax_append_think", "]~b]ai\n<think>\n\n</think>\n\n", "ok", [T("ok")]),
]


def run_reasoning_tokens(name: str, prompt: str, chunks: Sequence[Sequence[int]]) -> list[Event]:
    """One reasoning parser (no tool parser) behind the demo tokenizer: its markers matched by token id."""
    markers = MarkerIds(DEMO.tokenizer, REASONING_MARKERS[name])
    ctx = dataclasses.replace(counter_ids(), prompt=prompt, marker=markers.marker)
    p = OutputPipeline(IncrementalDetokenizer(DEMO.tokenizer, DEMO.eos_token_ids, markers),
                       REASONING_PARSERS[name](ctx), None, markers)
    events: list[Event] = []
    for chunk in chunks:
        events += p.feed(chunk)
    return merge_deltas(events + p.finish())


@pytest.mark.parametrize(("name", "prompt", "output", "expected"), [pytest.param(*c[1:], id=c[0]) for c in AUDIT])
def test_forced_reasoning_audit_whole_per_token_and_random_chunks(
    name: str, prompt: str, output: str, expected: list[Event]
) -> None:
    ids = [*DEMO.tokenizer.encode(output, add_special_tokens=False).ids, DEMO.eos_token_ids[0]]
    assert run_reasoning_tokens(name, prompt, [ids]) == expected
    assert run_reasoning_tokens(name, prompt, [[i] for i in ids]) == expected
    for seed in range(5):
        assert run_reasoning_tokens(name, prompt, random_chunks(ids, seed)) == expected  # type: ignore[arg-type]
    ctx = dataclasses.replace(counter_ids(), prompt=prompt)
    for pieces in ([output], list(output), *(random_chunks(output, seed) for seed in range(5))):
        assert run_parsers(REASONING_PARSERS[name](ctx), TOOL_PARSERS["hermes"](ctx), pieces) == expected  # type: ignore[arg-type]
