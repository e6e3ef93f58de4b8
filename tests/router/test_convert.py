"""Router frame conversion: a worker's plain token frame is passed on as it came; others are rebuilt."""

from __future__ import annotations

from services.api import common_pb2, worker_pb2
from services.router import convert
from services.router.stream import ProxyRequest, StreamProgress


def test_plain_token_frame_passes_through_unchanged() -> None:
    wire = worker_pb2.GenerateResponse(token_ids=[5, 6, 7])
    frame = convert.frame(wire)
    assert frame.token_ids == (5, 6, 7) and not frame.final
    out = StreamProgress(ProxyRequest("r", (1, 2, 3))).absorb(frame, "w1")
    assert out is not None and convert.generate_response(out) is wire


def test_rewritten_frames_are_rebuilt() -> None:
    progress = StreamProgress(ProxyRequest("r", (1, 2, 3)))
    first = worker_pb2.GenerateResponse(token_ids=[9], prompt=worker_pb2.PromptInfo(prompt_tokens=3))
    out = progress.absorb(convert.frame(first), "w1")
    assert out is not None
    sent = convert.generate_response(out)
    assert sent is not first and sent.prompt.worker_id == "w1" and list(sent.token_ids) == [9]
    last = worker_pb2.GenerateResponse(token_ids=[4], finish_reason=common_pb2.FINISH_REASON_LENGTH,
                                       usage=common_pb2.Usage(prompt_tokens=3, completion_tokens=2))
    out = progress.absorb(convert.frame(last), "w1")
    assert out is not None
    sent = convert.generate_response(out)
    assert sent is not last and sent.usage.completion_tokens == 2 and sent.finish_reason == last.finish_reason


def test_prefill_only_drops_the_tokens_of_a_plain_frame() -> None:
    progress = StreamProgress(ProxyRequest("r", (1, 2, 3), prefill_only=True))
    out = progress.absorb(convert.frame(worker_pb2.GenerateResponse(token_ids=[5])), "w1")
    assert out is None
