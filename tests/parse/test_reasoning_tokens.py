"""``usage.reasoning_tokens``: the tokens the reasoning parser classified as reasoning (``reasoning_tokens.py``)."""

from __future__ import annotations

from services.common.model_dir import load_model_dir
from services.parse.model_format import ModelFormat
from services.parse.parsers.events import Event, ReasoningDelta, TextDelta, ToolCallArgumentsDelta, ToolCallStart
from services.parse.reasoning_tokens import ReasoningTokenCounter

DEMO = load_model_dir(None)


def count(frames: list[tuple[int, list[Event]]]) -> int:
    counter = ReasoningTokenCounter()
    for tokens, events in frames:
        counter.feed(tokens, events)
    return counter.total


def test_markers_are_not_reasoning_and_held_text_inside_a_block_is() -> None:
    r, t = ReasoningDelta, TextDelta
    assert count([(1, []), (1, [r("a")]), (1, []), (1, [r("<b")]), (1, []), (1, [t("x")])]) == 3
    assert count([(1, [t("x")]), (1, []), (1, [r("a")]), (1, [r("b")]), (1, []), (1, [])]) == 2  # unclosed
    assert count([(1, [r("a")]), (1, [ToolCallStart(0, "c", "f")]), (1, [ToolCallArgumentsDelta(0, "c", "{}")])]) == 1


def test_a_frame_spanning_the_end_of_a_block_counts_its_reasoning_share() -> None:
    assert count([(4, [ReasoningDelta("abc"), TextDelta("d")])]) == 3
    assert count([(4, [TextDelta("visible")])]) == 0


def test_the_demo_models_output_counts_the_tokens_of_its_reasoning_text() -> None:
    """Fed one token per frame through the real pipeline: exactly the tokens of the reasoning text."""
    fmt = ModelFormat(DEMO, reasoning_parser="qwen3", tool_parser="hermes")
    reasoning = "Let me think: 2 + 2 is 4, café 日本語 😀."
    output = f"<think>\n{reasoning}\n</think>\n\nThe answer is 4."
    ids = [*DEMO.tokenizer.encode(output, add_special_tokens=False).ids, DEMO.eos_token_ids[0]]
    pipeline = fmt.output_pipeline("<|im_start|>assistant\n")
    counter = ReasoningTokenCounter()
    for i, token in enumerate(ids):
        events = pipeline.feed([token]) + (pipeline.finish() if i == len(ids) - 1 else [])
        counter.feed(1, events)
    assert counter.total == len(DEMO.tokenizer.encode(reasoning, add_special_tokens=False).ids)
