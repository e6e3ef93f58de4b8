"""Issue 34's two reported failures: a tool-call start marker written as prose, and a closer inside a value.

A coding model that mentions its own call syntax (``The literal token "<tool_call>" opens a call``) and
then makes a real call: the literal is text (kept, streamed at once), the real call parses. Checked on
the parsers (whole, per character, random chunks) and on the parse service over its gRPC API with the
demo tokenizer (where ``<tool_call>`` is one special token, matched by id).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from services.api import chat_pb2, common_pb2, parse_pb2_grpc, router_pb2_grpc, worker_pb2
from services.common import mux
from services.common.grpc_util import GrpcServer, open_channel
from services.parse.model_format import ModelFormat
from services.parse.parsers.events import Event, TextDelta, ToolCallArgumentsDelta, ToolCallDispatch, ToolCallStart
from services.parse.parsers.registry import REASONING_PARSERS, TOOL_PARSERS
from services.parse.parsers.tool_core import ParserContext
from services.parse.server import start
from services.parse.settings import ParseSettings
from tests.parse.support import run_parsers
from tests.parse.test_families import random_chunks
from tests.parse.test_service import DEMO, FakeRouter, scripted

PROSE = 'The literal token "<tool_call>" opens a call in this format. Now a real one:'
CALLS = {
    "hermes": '\n<tool_call>\n{"name": "Bash", "arguments": {"command": "ls -la"}}\n</tool_call>',
    "qwen3_coder": ("\n<tool_call>\n<function=Bash>\n<parameter=command>\nls -la\n</parameter>\n</function>\n"
                    "</tool_call>"),
}
SCHEMAS = {"Bash": {"type": "object", "properties": {"command": {"type": "string"}}}}
LS = '{"command": "ls -la"}'


def run(tool_parser: str, pieces: Sequence[str]) -> list[Event]:
    ids = (f"call_{i}" for i in itertools.count())
    ctx = ParserContext("", lambda: next(ids), SCHEMAS)
    return run_parsers(REASONING_PARSERS["qwen3"](ctx), TOOL_PARSERS[tool_parser](ctx), pieces)


def every_split(text: str) -> list[list[str]]:
    return [[text], list(text), *(random_chunks(text, seed) for seed in range(4))]


@pytest.mark.parametrize("tool_parser", sorted(CALLS))
def test_a_literal_marker_in_prose_is_text_and_the_real_call_after_it_parses(tool_parser: str) -> None:
    expected = [TextDelta(PROSE), ToolCallStart(0, "call_0", "Bash"), ToolCallArgumentsDelta(0, "call_0", LS),
                ToolCallDispatch(0, "call_0", "Bash", LS)]
    for pieces in every_split(PROSE + CALLS[tool_parser]):
        assert run(tool_parser, pieces) == expected


@pytest.mark.parametrize("tool_parser", sorted(CALLS))
def test_text_after_a_literal_marker_streams_at_once(tool_parser: str) -> None:
    """Fed per character, the text after the literal is never held for more than a marker's length."""
    text = PROSE + " More prose follows, and it keeps streaming." * 5
    ctx = ParserContext("", schemas=SCHEMAS)
    reasoning, tools = REASONING_PARSERS["qwen3"](ctx), TOOL_PARSERS[tool_parser](ctx)
    shown = 0
    for fed, c in enumerate(text, 1):
        for e in reasoning.feed(c):
            shown += sum(len(t.text) for t in tools.feed(e.text) if isinstance(t, TextDelta))
        assert fed - shown <= len("<tool_call>"), (fed, shown)
    assert shown + sum(len(t.text) for t in tools.finish() if isinstance(t, TextDelta)) == len(text)


def test_a_closer_inside_a_qwen3_coder_value_is_kept() -> None:
    value = 'grep -n "</parameter>" x.xml </parameter> && echo </function> done'
    text = (f"<tool_call>\n<function=Bash>\n<parameter=command>\n{value}\n</parameter>\n</function>\n</tool_call>")
    args = json.dumps({"command": value})
    for pieces in every_split(text):
        events = run("qwen3_coder", pieces)
        assert events[-1] == ToolCallDispatch(0, "call_0", "Bash", args)


@pytest.fixture
async def router() -> AsyncIterator[tuple[FakeRouter, str]]:
    fake = FakeRouter()
    server = GrpcServer(None, "127.0.0.1", 0)
    router_pb2_grpc.add_RouterServicer_to_server(fake, server.server)
    server.add_mux({mux.method_name("Router", "Generate"): mux.MuxMethod(fake.Generate, worker_pb2.GenerateRequest)})
    await server.start()
    try:
        yield fake, server.address
    finally:
        await server.stop(0)


def _request() -> chat_pb2.ChatRequest:
    return chat_pb2.ChatRequest(
        model="demo", messages=[chat_pb2.Message(role="user", parts=[chat_pb2.Part(text="List the files.")])],
        tools=[chat_pb2.Tool(name="Bash", description="Run", parameters_json=json.dumps(SCHEMAS["Bash"]))],
        identity=common_pb2.Identity(session_id="s1"))


@pytest.mark.parametrize("tool_parser", sorted(CALLS))
async def test_the_parse_service_keeps_the_literal_and_finishes_with_the_call(
    router: tuple[FakeRouter, str], tool_parser: str
) -> None:
    fake, address = router
    fake.script = scripted(PROSE + CALLS[tool_parser], batch=2)
    fmt = ModelFormat(DEMO, reasoning_parser="qwen3", tool_parser=tool_parser, max_model_len=4096)
    parse = await start(ParseSettings(port=0, router_address=address), model_format=fmt)
    channel = open_channel(parse.address, None)
    try:
        batches = [b async for b in parse_pb2_grpc.ParseStub(channel).Chat(_request())]
    finally:
        await channel.close()
        await parse.stop(0)
    events: list[Any] = [e for b in batches for e in b.events]
    text = "".join(e.text_delta.text for e in events if e.HasField("text_delta"))
    dispatched = [e.tool_call_dispatch for e in events if e.HasField("tool_call_dispatch")]
    finish = [e.finish.reason for e in events if e.HasField("finish")]
    assert text == PROSE
    assert [(d.call.name, d.call.arguments_json) for d in dispatched] == [("Bash", LS)]
    assert finish == [common_pb2.FINISH_REASON_TOOL_CALLS]
    # the prose streams: the text after the literal arrives batch by batch, long before the call
    shown = list(itertools.accumulate(
        "".join(e.text_delta.text for e in b.events if e.HasField("text_delta")) for b in batches))
    after_literal = next(i for i, t in enumerate(shown) if "opens" in t)
    first_call = next(i for i, b in enumerate(batches) if any(e.HasField("tool_call_start") for e in b.events))
    assert first_call - after_literal > 5
