"""Parse cost per output token: every parser family's core alone, and the parse service's gRPC stream.

* ``core``: for each tool format (with its paired reasoning parser), a long interleaved transcript
  (reasoning -> tool call -> reasoning -> tool call -> text, repeated) is fed in pieces of
  ``--chars-per-token`` characters (one "token" each, the typical size of a BPE token) through the
  reasoning parser and the tool parser, as the parse service does. Reports tokens/s on one core and
  microseconds per token.
* ``grpc``: ``Parse.Chat`` end to end on the demo model (qwen3 + hermes), with a router stub that
  streams the transcript's token ids in frames of ``--frame`` tokens: detokenizer, parsers, proto
  conversion and the gRPC stream.

The verdict compares the cost per token with ``--budget-ms`` (the mesh's per-token budget, 10 ms for
a 100 tokens/s stream): the goal is under 2 %. Usage: ``python bench/parse_throughput.py [--rounds 200]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.api import chat_pb2, common_pb2, parse_pb2_grpc, router_pb2_grpc, worker_pb2
from services.common.grpc_util import GrpcServer, open_channel
from services.common.model_dir import load_model_dir
from services.parse.parsers.events import TextDelta
from services.parse.parsers.registry import REASONING_PARSERS, TOOL_PARSERS
from services.parse.parsers.tool_core import ParserContext
from services.parse.server import start
from services.parse.settings import ParseSettings
from tests.parse.families import FAMILIES, Family
from tests.parse.test_families import NESTED, SCHEMAS, UNICODE, WEATHER


def transcript(fam: Family, rounds: int) -> str:
    parts = []
    for i in range(rounds):
        parts.append(fam.reasoning("Let me look at the files first; then I will read the config. " * 3))
        parts.append(fam.calls([WEATHER], 2 * i))
        parts.append(fam.reasoning("The first result is in. Now the nested one, with unicode. " * 3))
        parts.append(fam.calls([NESTED if i % 2 else UNICODE], 2 * i + 1))
    parts.append(fam.text("All done: both cities are mild today, about 20 degrees."))
    return "".join(parts)


def core_tokens_per_second(fam: Family, text: str, chars_per_token: int) -> tuple[float, int]:
    pieces = [text[i:i + chars_per_token] for i in range(0, len(text), chars_per_token)]
    ids = (f"call_{i}" for i in itertools.count())
    ctx = ParserContext("", lambda: next(ids), SCHEMAS)
    reasoning, tools = REASONING_PARSERS[fam.reasoning_parser](ctx), TOOL_PARSERS[fam.tool_parser](ctx)
    started = time.perf_counter()
    for piece in pieces:
        for event in reasoning.feed(piece):
            if isinstance(event, TextDelta):
                tools.feed(event.text)
    for event in reasoning.finish():
        if isinstance(event, TextDelta):
            tools.feed(event.text)
    tools.finish()
    return len(pieces) / (time.perf_counter() - started), len(pieces)


class _Router(router_pb2_grpc.RouterServicer):
    """Streams fixed token ids in frames, as fast as the consumer takes them."""

    def __init__(self, ids: list[int], frame: int) -> None:
        self._frames = [ids[i:i + frame] for i in range(0, len(ids), frame)]

    async def Generate(self, request: Any, context: Any) -> AsyncIterator[worker_pb2.GenerateResponse]:
        for n, chunk in enumerate(self._frames):
            frame = worker_pb2.GenerateResponse(token_ids=chunk)
            if n == len(self._frames) - 1:
                frame.finish_reason = common_pb2.FINISH_REASON_STOP
            yield frame

    async def ListWorkers(self, request: Any, context: Any) -> Any:
        raise NotImplementedError


async def grpc_tokens_per_second(rounds: int, frame: int) -> tuple[float, int]:
    model = load_model_dir(None)
    text = transcript(FAMILIES["hermes"], rounds)
    ids = [*model.tokenizer.encode(text, add_special_tokens=False).ids, model.eos_token_ids[0]]
    router = GrpcServer(None, "127.0.0.1", 0)
    router_pb2_grpc.add_RouterServicer_to_server(_Router(ids, frame), router.server)
    await router.start()
    settings = ParseSettings(port=0, router_address=router.address, reasoning_parser="qwen3", tool_parser="hermes")
    parse = await start(settings)
    channel = open_channel(parse.address, None)
    stub = parse_pb2_grpc.ParseStub(channel)
    request = chat_pb2.ChatRequest(model="demo", messages=[
        chat_pb2.Message(role="user", parts=[chat_pb2.Part(text="go")])])
    try:
        async for _ in stub.Chat(request):  # warm-up
            pass
        started = time.perf_counter()
        async for _ in stub.Chat(request):
            pass
        elapsed = time.perf_counter() - started
    finally:
        await channel.close()
        await parse.stop()
        await router.stop(0)
    return len(ids) / elapsed, len(ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200, help="think/call/think/call rounds per transcript")
    parser.add_argument("--chars-per-token", type=int, default=4)
    parser.add_argument("--frame", type=int, default=8, help="tokens per router frame (grpc path)")
    parser.add_argument("--budget-ms", type=float, default=10.0, help="the mesh's per-token budget")
    args = parser.parse_args()
    print(f"{'family':<16}{'reasoning':<16}{'tokens':>9}{'tokens/s/core':>15}{'us/token':>10}{'% budget':>10}")
    for name, fam in sorted(FAMILIES.items()):
        rate, tokens = core_tokens_per_second(fam, transcript(fam, args.rounds), args.chars_per_token)
        us = 1e6 / rate
        print(f"{name:<16}{fam.reasoning_parser:<16}{tokens:>9}{rate:>15,.0f}{us:>10.2f}"
              f"{100 * us / (args.budget_ms * 1000):>9.3f}%")
    rate, tokens = asyncio.run(grpc_tokens_per_second(args.rounds, args.frame))
    us = 1e6 / rate
    print(f"{'grpc Parse.Chat':<16}{'qwen3+hermes':<16}{tokens:>9}{rate:>15,.0f}{us:>10.2f}"
          f"{100 * us / (args.budget_ms * 1000):>9.3f}%")


if __name__ == "__main__":
    main()
