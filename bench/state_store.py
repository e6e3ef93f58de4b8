"""What the JetStream state modes cost per request, against the in-memory ones (issue 18).

Starts a real nats-server with JetStream on loopback (the launcher's own ``NatsServer``) and times, in
one run, alternating rounds of:

- the Responses store: one ``put`` (a turn ends) and one ``get`` (the next turn names it) of a typical
  stored response (a 12-message conversation, ~6 KB), ``memory`` vs ``jetstream``;
- the prefix watch around one turn of a session that stays on one replica (the common case): the
  ``pull`` before the first token (index only: this replica holds the current version) and the
  ``push`` after the last token, for a ~4k- and a ~100k-token session, ``memory`` vs ``jetstream``.

Prints the median microseconds per request of each and the ratio jetstream / memory.
Usage: ``python bench/state_store.py [--rounds 300]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.apis.responses.jetstream_store import JetStreamResponseStore
from gateway.apis.responses.store import ResponseStore
from services.api import chat_pb2
from services.common.jetstream import BucketConfig, ChunkedKv, chunk_size_for, open_bucket
from services.common.nats_util import close_nats, connect_nats
from services.launcher.nats_server import NatsServer
from services.parse.prefix_state import JetStreamPrefixState, LocalPrefixState, PrefixState
from services.parse.prefix_watch import PrefixWatch
from tests.support.nats import free_port

Step = Callable[[int], Awaitable[None]]


def conversation() -> list[chat_pb2.Message]:
    text = "Please look at the failing test and fix the bug in the parser. " * 6
    return [chat_pb2.Message(role="user" if i % 2 == 0 else "assistant", parts=[chat_pb2.Part(text=text)])
            for i in range(12)]


RESPONSE = {"id": "resp_x", "object": "response", "status": "completed", "model": "demo",
            "output": [{"type": "message", "content": [{"type": "output_text", "text": "done " * 100}]}]}


def responses_step(store: ResponseStore | JetStreamResponseStore) -> Step:
    messages = conversation()

    async def step(i: int) -> None:
        await store.put(f"resp_{i}", messages, RESPONSE)
        assert await store.get(f"resp_{i}") is not None

    return step


def prefix_step(state: PrefixState, tokens: int) -> Step:
    watch = PrefixWatch(lambda ids: "")
    history = list(range(tokens))

    async def step(i: int) -> None:  # each turn extends the last: prompt = history + a new message
        session = f"s{tokens}"
        await state.pull(watch, session)
        prompt = [*history, i]
        turn = watch.begin(session, prompt)
        assert turn is not None and not watch.breaks
        turn.extend([7, 8])
        turn.commit()
        history[:] = [*prompt, 7, 8]
        await state.push(watch, session)

    return step


async def timed(step: Step, i: int) -> float:
    started = time.perf_counter()
    await step(i)
    return (time.perf_counter() - started) * 1e6


async def main(rounds: int) -> None:
    server = NatsServer(free_port())
    await server.start(10)
    nc = await connect_nats(server.url, "bench", token=server.token)
    try:
        js = nc.jetstream()
        responses_kv = ChunkedKv(await open_bucket(js, BucketConfig("bench_responses", 3600, 1 << 30)),
                                 chunk_size=chunk_size_for(nc))
        prefix_kv = ChunkedKv(await open_bucket(js, BucketConfig("bench_prefix", 3600, 1 << 30)),
                              chunk_size=chunk_size_for(nc), inline_max=256)
        pairs: dict[str, tuple[Step, Step]] = {
            "responses put+get": (responses_step(ResponseStore(4096)), responses_step(
                JetStreamResponseStore(responses_kv, bucket="bench_responses", ttl=3600, max_bytes=-1))),
        }
        for tokens in (4_000, 100_000):
            pairs[f"prefix watch {tokens // 1000}k pull+push"] = (
                prefix_step(LocalPrefixState(), tokens),
                prefix_step(JetStreamPrefixState(prefix_kv, timeout=5, connected=lambda: True), tokens))
        pulls = JetStreamPrefixState(prefix_kv, timeout=5)
        pull_watch = PrefixWatch(lambda ids: "")
        turn = pull_watch.begin("p", list(range(4000)))
        assert turn is not None
        turn.commit()
        await pulls.push(pull_watch, "p")

        async def pull_only(i: int) -> None:
            await pulls.pull(pull_watch, "p")

        results: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in pairs}
        pull_times: list[float] = []
        for i in range(rounds):  # alternate: drift hits both modes alike
            for name, (memory, jet) in pairs.items():
                results[name][0].append(await timed(memory, i))
                results[name][1].append(await timed(jet, i))
            pull_times.append(await timed(pull_only, i))
        print(f"{'per request':32} {'memory us':>10} {'jetstream us':>13} {'ratio':>8}")
        for name, (memory_t, jet_t) in results.items():
            m, j = statistics.median(memory_t), statistics.median(jet_t)
            print(f"{name:32} {m:10.1f} {j:13.1f} {j / m:8.0f}x")
        print(f"{'prefix watch pull (before TTFT)':32} {'':10} {statistics.median(pull_times):13.1f}")
    finally:
        await close_nats(nc)
        await server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    asyncio.run(main(parser.parse_args().rounds))
