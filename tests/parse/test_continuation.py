"""A stream resumed on another parse replica (``continuation.py``, ``OutputPipeline.replay``): the silent replay
rebuilds the state streaming the same frames gives, and the service sends only what comes after."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.api import chat_pb2, common_pb2, worker_pb2
from services.common import token_bytes
from services.common.errors import InvalidRequestError
from services.parse.continuation import Continued
from services.parse.model_format import ModelFormat
from services.parse.parsers.events import Event, ToolCallStart
from services.parse.reasoning_tokens import ReasoningTokenCounter
from services.parse.server import RunningParse
from tests.parse.test_service import DEMO, FakeRouter, chat_request, collect, mesh  # noqa: F401 - mesh: a fixture

OUTPUT = ("<think>\nCompare Paris and Tōkyō: café ☕, 日本語.\n</think>\n\nChecking both cities now.\n"
          '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tōkyō"}}\n</tool_call>')
IDS = [*DEMO.tokenizer.encode(OUTPUT, add_special_tokens=False).ids, DEMO.eos_token_ids[0]]
FORMAT = ModelFormat(DEMO, reasoning_parser="qwen3", tool_parser="hermes")
PROMPT = "<|im_start|>assistant\n"


def fresh_ids_named(events: list[list[Event]], sent: int) -> list[list[Event]]:
    """``events`` with the random ids of calls started after the first ``sent`` ones named by their index."""
    return [[dataclasses.replace(e, id=f"new-{e.index}") if hasattr(e, "id") and e.index >= sent else e
             for e in frame] for frame in events]


def proto_ids_named(batches: list[chat_pb2.ChatEventBatch], sent: int) -> list[list[chat_pb2.ChatEvent]]:
    """The batches' events, the ids of calls started after the first ``sent`` named by their index."""
    out = []
    for batch in batches:
        events = []
        for event in batch.events:
            named = chat_pb2.ChatEvent()
            named.CopyFrom(event)
            for part in (named.tool_call_start, named.tool_call_arguments_delta):
                if part.id and part.index >= sent:
                    part.id = f"new-{part.index}"
            if named.HasField("tool_call_dispatch") and named.tool_call_dispatch.index >= sent:
                named.tool_call_dispatch.call.id = f"new-{named.tool_call_dispatch.index}"
            events.append(named)
        out.append(events)
    return out


def frames_of(ids: list[int], seed: int) -> list[list[int]]:
    rng, out, at = random.Random(seed), [], 0
    while at < len(ids):
        size = rng.choice((1, 1, 1, 2, 3, 5))
        out.append(ids[at:at + size])
        at += size
    return out


def streamed(frames: list[list[int]]) -> tuple[list[list[Event]], list[int]]:
    """Each frame's events, and the reasoning token count after each frame."""
    pipeline, counter = FORMAT.output_pipeline(PROMPT), ReasoningTokenCounter()
    out, counts = [], []
    for i, frame in enumerate(frames):
        events = pipeline.feed(frame) + (pipeline.finish() if i == len(frames) - 1 else [])
        counter.feed(len(frame), events)
        out.append(events)
        counts.append(counter.total)
    return out, counts


@pytest.mark.parametrize("seed", range(4))
def test_replay_rebuilds_the_state_streaming_the_same_frames_gives(seed: int) -> None:
    frames = frames_of(IDS, seed)
    clean, counts = streamed(frames)
    for cut in range(1, len(frames) - 1):
        sent_calls = [e.id for events in clean[:cut] for e in events if isinstance(e, ToolCallStart)]
        pipeline, counter = FORMAT.output_pipeline(PROMPT, call_ids=sent_calls), ReasoningTokenCounter()
        for frame, events in zip(frames[:cut], pipeline.replay(frames[:cut]), strict=True):
            counter.feed(len(frame), events)
        assert pipeline.tool_calls == sum(type(e).__name__ == "ToolCallDispatch" for ev in clean[:cut] for e in ev)
        assert counter.total == counts[cut - 1]
        rest = []
        for i, frame in enumerate(frames[cut:], cut):
            events = pipeline.feed(frame) + (pipeline.finish() if i == len(frames) - 1 else [])
            counter.feed(len(frame), events)
            rest.append(events)
        # the same events from the cut on, the calls already sent with their ids
        assert fresh_ids_named(rest, len(sent_calls)) == fresh_ids_named(clean[cut:], len(sent_calls)), cut
        assert counter.total == counts[-1]
        assert pipeline.tool_calls == 2


def test_carried_call_ids_come_first_then_new_ones() -> None:
    pipeline = FORMAT.output_pipeline(PROMPT, call_ids=["call_kept"])
    first, second = [e for e in pipeline.feed(IDS) + pipeline.finish() if isinstance(e, ToolCallStart)]
    assert first.id == "call_kept" and second.id.startswith("call_") and second.id != "call_kept"


def test_continued_router_request_and_usage() -> None:
    first = worker_pb2.GenerateRequest(request_id="r1", sampling=common_pb2.SamplingParams(max_tokens=10))
    prompt = token_bytes.pack([1, 2, 3])
    first.hints.osl = 6
    cont = Continued.from_proto(chat_pb2.Continuation(
        token_ids_u32=token_bytes.pack([7, 8, 9]), frame_sizes=[1, 2], prompt_tokens=3, cached_tokens=2, resumes=2))
    assert cont.frames == ((7,), (8, 9))
    resumed = cont.router_request(first, prompt)
    assert resumed is not None
    rest, rest_prompt = resumed
    assert token_bytes.unpack(rest_prompt) == [1, 2, 3, 7, 8, 9] and not rest.token_ids_u32
    assert (rest.continued_tokens, rest.sampling.max_tokens, rest.hints.osl) == (3, 7, 3)
    assert rest.request_id == "r1.resumed2" and first.sampling.max_tokens == 10  # first left as it came
    usage = common_pb2.Usage(prompt_tokens=6, completion_tokens=4, cached_tokens=5)
    cont.whole_usage(usage)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (3, 7, 2)
    first.sampling.max_tokens = 3
    assert cont.router_request(first, prompt) is None  # every allowed token came already
    with pytest.raises(InvalidRequestError):
        Continued.from_proto(chat_pb2.Continuation(token_ids_u32=token_bytes.pack([7, 8]), frame_sizes=[1]))


def continuing(ids: list[int]) -> Any:
    """A router that answers with ``ids`` one per frame, a continuation with the ids after its continued ones."""

    async def script(request: worker_pb2.GenerateRequest, context: Any) -> AsyncIterator[worker_pb2.GenerateResponse]:
        prompt = token_bytes.count(request.token_ids_u32)
        rest = ids[request.continued_tokens:]
        for n, token in enumerate(rest):
            frame = worker_pb2.GenerateResponse(token_ids=[token])
            if n == 0:
                frame.prompt.CopyFrom(worker_pb2.PromptInfo(prompt_tokens=prompt, cached_tokens=prompt // 2))
            if n == len(rest) - 1:
                frame.finish_reason = common_pb2.FINISH_REASON_STOP
                frame.usage.CopyFrom(common_pb2.Usage(prompt_tokens=prompt, completion_tokens=len(rest),
                                                      cached_tokens=prompt // 2))
            yield frame

    return script


async def test_the_service_resumes_a_stream_from_its_batches(
    mesh: tuple[FakeRouter, Any, RunningParse],  # noqa: F811 - the fixture imported above
) -> None:
    """What a gateway keeps of a stream's first batches, sent back as a Continuation, gives exactly the rest of
    the clean stream: no second Started, the same call ids, usage and reasoning tokens counted once."""
    router, stub, _ = mesh
    router.script = continuing(IDS)
    request = chat_request(request_id="req-1", sampling=common_pb2.SamplingParams(max_tokens=500))
    clean = await collect(stub, request)
    assert b"".join(b.token_ids_u32 for b in clean) == token_bytes.pack(IDS)
    for cut in (1, 5, len(clean) // 2, len(clean) - 2):
        cont = chat_pb2.Continuation(resumes=1)
        for batch in clean[:cut]:
            cont.token_ids_u32 += batch.token_ids_u32
            cont.frame_sizes.extend(batch.frame_sizes or [token_bytes.count(batch.token_ids_u32)])
            cont.tool_call_ids.extend(e.tool_call_start.id for e in batch.events if e.HasField("tool_call_start"))
            for e in batch.events:
                if e.HasField("started"):
                    cont.prompt_tokens, cont.cached_tokens = e.started.prompt_tokens, e.started.cached_tokens
        again = chat_pb2.ChatRequest()
        again.CopyFrom(request)
        again.continuation.CopyFrom(cont)
        resumed = await collect(stub, again)
        sent = len(cont.tool_call_ids)
        assert proto_ids_named(resumed, sent) == proto_ids_named(clean[cut:], sent), cut
        last = router.requests[-1]
        assert last.continued_tokens == token_bytes.count(cont.token_ids_u32) and last.request_id == "req-1.resumed1"
