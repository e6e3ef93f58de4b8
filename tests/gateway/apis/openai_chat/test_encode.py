"""ChunkEncoder in isolation: coalescing, ordering, dispatch-only tool calls, the non-streaming reply."""

from __future__ import annotations

from gateway.apis.openai_chat.encode import ChunkEncoder
from services.api import common_pb2
from tests.gateway.fake_parse import (
    batch,
    call_args,
    call_start,
    dispatch,
    finish,
    reasoning,
    started,
    text,
    usage,
)


def _deltas(chunks: list[dict[str, object]]) -> list[object]:
    return [c["choices"][0]["delta"] for c in chunks]  # type: ignore[index]


def test_batch_with_reasoning_and_text_is_one_chunk() -> None:
    enc = ChunkEncoder("id", "m", 0, include_usage=False)
    chunks = enc.feed(batch(started(), reasoning("a"), reasoning("b"), text("c")))
    assert _deltas(chunks) == [{"role": "assistant", "reasoning_content": "ab", "content": "c"}]


def test_reasoning_after_text_starts_a_new_chunk() -> None:
    enc = ChunkEncoder("id", "m", 0, include_usage=False)
    chunks = enc.feed(batch(text("a"), reasoning("b"), text("c")))
    assert _deltas(chunks) == [{"role": "assistant", "content": "a"}, {"reasoning_content": "b", "content": "c"}]


def test_tool_call_start_and_args_merge_in_one_chunk() -> None:
    enc = ChunkEncoder("id", "m", 0, include_usage=False)
    enc.feed(batch(started()))
    events = [call_start(0, "c0", "f"), call_args(0, '{"a"'), call_args(0, ":1}"), call_start(1, "c1", "g")]
    chunks = enc.feed(batch(*events))
    assert _deltas(chunks) == [
        {
            "tool_calls": [
                {"index": 0, "id": "c0", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}},
                {"index": 1, "id": "c1", "type": "function", "function": {"name": "g", "arguments": ""}},
            ]
        }
    ]


def test_dispatch_only_call_is_announced_and_filled() -> None:
    enc = ChunkEncoder("id", "m", 0, include_usage=True)
    chunks = enc.feed(batch(started(), dispatch(0, "c", "f", "{}"), finish(), usage(3, 4, cached=2)))
    calls = chunks[0]["choices"][0]["delta"]["tool_calls"]  # type: ignore[index]
    assert calls[0]["function"] == {"name": "f", "arguments": "{}"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"  # type: ignore[index]
    tail = enc.close()
    assert tail[-1]["choices"] == [] and tail[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}  # type: ignore[index]


def test_stream_without_finish_is_closed_with_stop() -> None:
    enc = ChunkEncoder("id", "m", 0, include_usage=False)
    enc.feed(batch(text("x")))
    assert enc.close()[0]["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]


def test_reply_prefers_dispatched_call() -> None:
    enc = ChunkEncoder("id", "m", 0, include_usage=False)
    enc.feed(batch(started(5, 1), call_start(0, "c", "f"), call_args(0, '{"x":')))
    enc.feed(batch(dispatch(0, "c", "f", '{"x": 1}'), finish(common_pb2.FINISH_REASON_TOOL_CALLS)))
    response = enc.reply()
    message = response["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'
    assert response["usage"]["prompt_tokens"] == 5
