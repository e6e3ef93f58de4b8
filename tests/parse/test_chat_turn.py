"""``ChatTurn`` over an in-memory router stream (no gRPC): the turn is recorded at its finish frame."""

from __future__ import annotations

import ast
from collections.abc import AsyncIterator, Sequence

from services.api import common_pb2, worker_pb2
from services.common.errors import InternalError, UnavailableError
from services.parse.chat_turn import ChatTurn
from services.parse.model_format import ModelFormat
from services.parse.prefix_watch import PrefixWatch
from tests.parse.support import REPO
from tests.parse.test_service import DEMO

FMT = ModelFormat(DEMO, reasoning_parser="qwen3", tool_parser="hermes", max_model_len=4096)
OUTPUT = "<think>\nShort.\n</think>\n\nHello there, all good."
PROMPT = [1, 2, 3, 4]


class Frames:
    """A router stream of fixed frames; remembers whether it was cancelled."""

    def __init__(self, frames: Sequence[worker_pb2.GenerateResponse]) -> None:
        self._frames = frames
        self.cancelled = False
        self.read = 0

    def cancel(self) -> None:
        self.cancelled = True

    async def __aiter__(self) -> AsyncIterator[worker_pb2.GenerateResponse]:
        for frame in self._frames:
            self.read += 1
            yield frame


def frames(text: str = OUTPUT, *, finish: bool = True, error: bool = False) -> list[worker_pb2.GenerateResponse]:
    ids = DEMO.tokenizer.encode(text, add_special_tokens=False).ids
    out = [worker_pb2.GenerateResponse(token_ids=ids[i:i + 3]) for i in range(0, len(ids), 3)]
    out[0].prompt.CopyFrom(worker_pb2.PromptInfo(prompt_tokens=len(PROMPT), worker_id="w1"))
    if error:
        out.append(worker_pb2.GenerateResponse(error=common_pb2.Error(code=common_pb2.ERROR_CODE_UNAVAILABLE,
                                                                      message="worker died")))
    elif finish:
        out.append(worker_pb2.GenerateResponse(finish_reason=common_pb2.FINISH_REASON_STOP))
    out.append(worker_pb2.GenerateResponse())  # what a router may send after the finish frame
    return out


def new_turn(watch: PrefixWatch, finished: list[str]) -> ChatTurn:
    return ChatTurn(request_id="r1", model="demo", prompt_tokens=len(PROMPT), pipeline=FMT.output_pipeline(""),
                    watched=watch.begin("s1", PROMPT),
                    on_finish=lambda turn: (finished.append(turn.request_id), turn.watched and turn.watched.commit()))


def recorded(watch: PrefixWatch) -> int:
    return len(watch.histories("s1") or [])


async def test_a_consumer_that_stops_at_the_finish_batch_still_records_the_turn() -> None:
    watch, finished = PrefixWatch(FMT.decode), []
    turn = new_turn(watch, finished)
    stream = Frames(frames())
    batches = turn.stream(stream)
    async for batch in batches:
        if any(e.HasField("finish") for e in batch.events):
            break  # the gateway closes the stream on the finish frame
    await batches.aclose()
    assert finished == ["r1"] and turn.finished
    (history,) = watch.histories("s1") or []
    assert FMT.decode(list(history.tokens[len(PROMPT):])) == OUTPUT
    assert stream.cancelled and stream.read < len(frames())  # the router call is left, not read to its end


async def test_a_turn_cancelled_before_its_finish_is_not_recorded() -> None:
    watch, finished = PrefixWatch(FMT.decode), []
    turn = new_turn(watch, finished)
    batches = turn.stream(Frames(frames()))
    async for _ in batches:
        break
    await batches.aclose()
    assert finished == [] and recorded(watch) == 0 and not turn.finished


async def test_ten_turns_closed_at_the_finish_are_ten_recorded() -> None:
    watch, finished = PrefixWatch(FMT.decode), []
    for _ in range(10):
        batches = new_turn(watch, finished).stream(Frames(frames()))
        async for batch in batches:
            if any(e.HasField("finish") for e in batch.events):
                break
        await batches.aclose()
    assert len(finished) == 10


async def test_events_in_order_with_started_first_and_finish_last() -> None:
    watch, finished = PrefixWatch(FMT.decode), []
    turn = new_turn(watch, finished)
    kinds = [str(e.WhichOneof("event")) async for b in turn.stream(Frames(frames())) for e in b.events]
    assert kinds[0] == "started" and kinds[-2:] == ["usage", "finish"]
    assert {"reasoning_delta", "text_delta"} <= set(kinds)
    assert turn.error is None and turn.worker_id == "w1"


async def test_a_router_error_or_a_missing_finish_is_the_turns_error_and_nothing_is_recorded() -> None:
    for stream, kind in ((frames(error=True), UnavailableError), (frames(finish=False), InternalError)):
        watch, finished = PrefixWatch(FMT.decode), []
        turn = new_turn(watch, finished)
        sent = [b async for b in turn.stream(Frames(stream))]
        assert isinstance(turn.error, kind) and turn.sent == bool(sent)
        assert finished == [] and recorded(watch) == 0


def test_no_function_in_the_parse_service_is_over_80_lines() -> None:
    tree = ast.parse((REPO / "services" / "parse" / "service.py").read_text())
    long = {n.name: n.end_lineno - n.lineno + 1 for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.end_lineno - n.lineno + 1 > 80}
    assert long == {}
