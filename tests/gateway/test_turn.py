"""The API-neutral fold of a turn: tool-call fix-ups, usage, finish, and the first error ending the turn."""

from __future__ import annotations

from gateway.turn import (
    CallArguments,
    CallDispatched,
    CallStarted,
    Failed,
    Finished,
    Started,
    Text,
    TurnFold,
)
from services.api import common_pb2
from tests.gateway.fake_parse import batch, call_args, call_start, dispatch, error, finish, started, text, usage


def test_dispatch_before_arguments_is_announced_and_filled_first() -> None:
    fold = TurnFold()
    deltas = fold.feed(batch(started(), call_start(0, "c0", "f"), call_args(0, '{"a"'), dispatch(0, "c0", "f",
                                                                                                '{"a": 1}')))
    # The dispatched arguments complete what streamed (``: 1}``) before the dispatch itself.
    assert [type(d) for d in deltas] == [Started, CallStarted, CallArguments, CallArguments, CallDispatched]
    assert isinstance(deltas[3], CallArguments) and deltas[3].piece == ": 1}"
    deltas = fold.feed(batch(dispatch(1, "", "g", "{}")))
    assert [type(d) for d in deltas] == [CallStarted, CallArguments, CallDispatched]
    assert fold.calls[1].id == "call_1" and fold.calls[1].arguments == "{}" and fold.calls[1].dispatched
    assert fold.calls[0].arguments == '{"a": 1}'
    assert fold.feed(batch(dispatch(1, "", "g", "{}"), call_args(1, "x"))) == []  # nothing new


def test_usage_event_wins_but_zero_keeps_what_started_said() -> None:
    fold = TurnFold()
    fold.feed(batch(started(100, 64)))
    assert (fold.usage.prompt_tokens, fold.usage.cached_tokens) == (100, 64)
    fold.feed(batch(text("x"), usage(0, 7)))
    assert (fold.usage.prompt_tokens, fold.usage.cached_tokens, fold.usage.completion_tokens) == (100, 64, 7)


def test_output_after_finish_is_ignored_usage_is_not() -> None:
    fold = TurnFold()
    deltas = fold.feed(batch(text("a"), finish(common_pb2.FINISH_REASON_LENGTH), text("b"), usage(3, 4)))
    assert [type(d) for d in deltas] == [Text, Finished]
    assert fold.text == "a" and fold.finish_name == "length" and fold.usage.completion_tokens == 4


def test_first_error_ends_the_turn() -> None:
    fold = TurnFold()
    deltas = fold.feed(batch(text("a"), error(common_pb2.ERROR_CODE_UNAVAILABLE, "gone"), text("b")))
    assert [type(d) for d in deltas] == [Text, Failed]
    assert fold.error is not None and fold.error.message == "gone"
    assert fold.feed(batch(text("c"), finish())) == [] and fold.text == "a" and not fold.finished
