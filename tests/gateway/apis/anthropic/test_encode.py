"""The Anthropic stream encoder: block order, dispatch timing, whitespace, stop reasons, usage, errors."""

from __future__ import annotations

import json
from typing import Any

from gateway.apis.anthropic.encode import MessageEncoder, tool_use_id
from gateway.apis.anthropic.signing import ThinkingSigner
from gateway.streaming import typed_events
from services.api import chat_pb2, common_pb2
from tests.gateway.fake_parse import (
    batch,
    call_args,
    call_start,
    dispatch,
    error,
    finish,
    reasoning,
    started,
    text,
    usage,
)

SIGNER = ThinkingSigner("test-key")


def encode(*batches: chat_pb2.ChatEventBatch) -> tuple[MessageEncoder, list[list[dict[str, Any]]]]:
    encoder = MessageEncoder("msg_1", "demo", SIGNER)
    return encoder, [encoder.feed(b) for b in batches]


def flat(outs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [e for out in outs for e in out]


def blocks(events: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(e["index"], e["content_block"]["type"]) for e in events if e["type"] == "content_block_start"]


def test_interleaved_think_tool_think_tool_is_four_blocks_in_order() -> None:
    _, outs = encode(
        batch(started(100, 64), reasoning("first "), reasoning("thought")),
        batch(text("\n\n"), call_start(0, "c0", "Bash"), call_args(0, '{"command": '), call_args(0, '"ls"}')),
        batch(dispatch(0, "c0", "Bash", '{"command": "ls"}')),
        batch(reasoning("second thought"), text("\n\n"), call_start(1, "c1", "Read")),
        batch(call_args(1, '{"file_path": "a"}'), dispatch(1, "c1", "Read", '{"file_path": "a"}')),
        batch(usage(100, 20, cached=64), finish(common_pb2.FINISH_REASON_TOOL_CALLS)),
    )
    events = flat(outs)
    assert blocks(events) == [(0, "thinking"), (1, "tool_use"), (2, "thinking"), (3, "tool_use")]
    # The first thinking block closes with its signature before the tool block opens; never reopened.
    sig = next(e for e in events if e["type"] == "content_block_delta" and e["delta"]["type"] == "signature_delta")
    assert sig["index"] == 0 and SIGNER.verify("first thought", sig["delta"]["signature"]) == "valid"
    thinking_deltas = [e for e in events if e.get("delta", {}).get("type") == "thinking_delta"]
    assert [(e["index"], e["delta"]["thinking"]) for e in thinking_deltas] == [
        (0, "first "), (0, "thought"), (2, "second thought")]
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    assert events[-1] == {"type": "message_stop"}


def test_tool_block_stops_the_moment_arguments_complete() -> None:
    _, outs = encode(
        batch(started(), call_start(0, "c0", "Bash"), call_args(0, '{"command": "l')),
        batch(call_args(0, 's"}'), dispatch(0, "c0", "Bash", '{"command": "ls"}')),
        batch(text("more text after the call")),
        batch(usage(7, 9), finish(common_pb2.FINISH_REASON_TOOL_CALLS)),
    )
    assert {"type": "content_block_stop", "index": 0} not in outs[0]  # incomplete JSON: still open
    assert outs[1][-1] == {"type": "content_block_stop", "index": 0}  # dispatch: closed in the same batch
    partial = "".join(e["delta"]["partial_json"] for e in flat(outs) if e.get("delta", {}).get("type") ==
                      "input_json_delta")
    assert json.loads(partial) == {"command": "ls"}


def test_each_block_is_stopped_once_when_a_parallel_call_starts_before_the_first_dispatch() -> None:
    _, outs = encode(
        batch(started(), call_start(0, "c0", "Bash"), call_args(0, '{"command": "ls"}'),
              call_start(1, "c1", "Read"), call_args(1, '{"path": "a"}')),
        batch(dispatch(0, "c0", "Bash", '{"command": "ls"}'), dispatch(1, "c1", "Read", '{"path": "a"}')),
        batch(usage(7, 9), finish(common_pb2.FINISH_REASON_TOOL_CALLS)),
    )
    stops = [e["index"] for e in flat(outs) if e["type"] == "content_block_stop"]
    assert stops == [0, 1]


def test_arguments_only_in_dispatch_are_still_sent() -> None:
    _, outs = encode(batch(started(), dispatch(0, "c0", "Bash", '{"command": "ls"}'), finish()))
    events = flat(outs)
    assert blocks(events) == [(0, "tool_use")]
    assert [e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"] == ['{"command": "ls"}']


def test_incomplete_tool_call_is_never_closed() -> None:
    _, outs = encode(batch(started(), call_start(0, "c0", "Bash"), call_args(0, '{"comm')),
                     batch(usage(7, 9), finish(common_pb2.FINISH_REASON_LENGTH)))
    events = flat(outs)
    assert not [e for e in events if e["type"] == "content_block_stop"]
    assert events[-2]["delta"]["stop_reason"] == "max_tokens"


def test_no_empty_or_whitespace_only_text_blocks() -> None:
    _, outs = encode(
        batch(started(), reasoning("hmm"), text("\n\n"), text("  ")),
        batch(call_start(0, "c", "Bash"), dispatch(0, "c", "Bash", "{}"), text("\n")),
        batch(finish()),
    )
    events = flat(outs)
    assert blocks(events) == [(0, "thinking"), (1, "tool_use")]


def test_text_after_thinking_loses_the_separator_only() -> None:
    _, outs = encode(batch(started(), reasoning("r"), text("\n\n"), text("Hello"), text(" world\n")), batch(finish()))
    texts = [e["delta"]["text"] for e in flat(outs) if e.get("delta", {}).get("type") == "text_delta"]
    assert "".join(texts) == "Hello world\n"


def test_usage_input_is_uncached_part_and_cache_read_is_real() -> None:
    _, outs = encode(batch(started(1000, 960)), batch(text("x"), usage(1000, 5, cached=960), finish()))
    start = outs[0][0]["message"]
    assert start["usage"] == {"input_tokens": 40, "cache_creation_input_tokens": 0,
                              "cache_read_input_tokens": 960, "output_tokens": 0}
    delta = flat(outs)[-2]
    assert delta["usage"]["output_tokens"] == 5 and delta["usage"]["cache_read_input_tokens"] == 960


def test_stop_sequence_and_end_turn() -> None:
    _, outs = encode(batch(started(), text("a"), chat_pb2.ChatEvent(finish=chat_pb2.Finish(
        reason=common_pb2.FINISH_REASON_STOP, stop_string="STOP"))))
    assert outs[0][-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "STOP"}
    _, outs = encode(batch(started(), text("a"), finish()))
    assert outs[0][-2]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}


def test_error_event_is_reported_to_the_caller() -> None:
    encoder, _ = encode(batch(started(), text("a")), batch(error(common_pb2.ERROR_CODE_UNAVAILABLE, "worker died")))
    assert encoder.error is not None and encoder.error.message == "worker died"
    assert not encoder.finished


def test_error_event_ends_the_stream_like_every_api() -> None:
    _, outs = encode(batch(started(), text("a"), error(common_pb2.ERROR_CODE_UNAVAILABLE, "gone"), text("b")),
                     batch(text("c"), finish()))
    assert [e["type"] for e in flat(outs)] == ["message_start", "content_block_start", "content_block_delta"]


def test_reply_is_the_message_the_stream_showed() -> None:
    encoder, _ = encode(
        batch(started(50, 0), reasoning("plan"), text("\n\n"), text("Running.")),
        batch(call_start(0, "c0", "Bash"), call_args(0, '{"command": "ls"}'), dispatch(0, "c0", "Bash",
                                                                                      '{"command": "ls"}')),
        batch(usage(50, 12), finish(common_pb2.FINISH_REASON_TOOL_CALLS)),
    )
    message = encoder.reply()
    assert [b["type"] for b in message["content"]] == ["thinking", "text", "tool_use"]
    assert message["content"][0]["thinking"] == "plan" and message["content"][0]["signature"].startswith("hm1.")
    assert message["content"][1]["text"] == "Running."
    assert message["content"][2]["input"] == {"command": "ls"}
    assert message["stop_reason"] == "tool_use" and message["usage"]["output_tokens"] == 12


def test_sse_framing_has_event_names_and_no_done() -> None:
    raw = typed_events([{"type": "message_stop"}, {"type": "ping"}])
    assert raw == b'event: message_stop\ndata: {"type":"message_stop"}\n\nevent: ping\ndata: {"type":"ping"}\n\n'
    assert b"[DONE]" not in raw


def test_signatures() -> None:
    sig = SIGNER.sign("abc")
    assert SIGNER.verify("abc", sig) == "valid"
    assert SIGNER.verify("abd", sig) == "invalid"
    assert SIGNER.verify("abc", "") == "missing"
    assert SIGNER.verify("abc", "EqQBCkgIARABGAIiQL") == "foreign"
    assert ThinkingSigner("other").verify("abc", sig) == "invalid"


def test_tool_use_ids_take_anthropics_prefix() -> None:
    _, outs = encode(
        batch(started(), call_start(0, "call_4f2a9c", "Bash"), call_args(0, '{"command": "ls"}')),
        batch(dispatch(0, "call_4f2a9c", "Bash", '{"command": "ls"}'), finish(common_pb2.FINISH_REASON_TOOL_CALLS)),
    )
    (start,) = [e for e in flat(outs) if e["type"] == "content_block_start"]
    assert start["content_block"]["id"] == "toolu_4f2a9c"
    assert tool_use_id("toolu_x") == "toolu_x" and tool_use_id("t1") == "t1"  # a client's own ids are kept
