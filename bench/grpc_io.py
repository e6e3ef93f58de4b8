"""gRPC's socket I/O: the EventEngine (grpcio's default since 1.80) vs. the poller the services choose.

    python bench/grpc_io.py [--rounds 4] [--messages 400]

Each round starts, for each engine in turn, a server process and a client process (``GRPC_EXPERIMENTS``
set in their environment before grpc loads, as ``services/common/grpc_io.py`` does) that echo one small
message at a time over one bidi stream (the shape of the mesh's ``Mux/Session`` hops), and prints the
median round trip. The table gives the medians over rounds and the ratio poller / EventEngine (paired:
the median of each round's own ratio). Backs the figure in ``services/common/grpc_io.py`` and the README.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # services.common.grpc_io, when the repo is not installed (as every bench)
ENGINES = {"event-engine": "", "poller": None}  # None: services.common.grpc_io.POLLER_IO

SERVER = """
import asyncio, grpc
from services.api import mux_pb2_grpc

class Echo(mux_pb2_grpc.MuxServicer):
    async def Session(self, requests, context):
        async for batch in requests:
            yield batch

async def main():
    server = grpc.aio.server()
    mux_pb2_grpc.add_MuxServicer_to_server(Echo(), server)
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    await server.start()
    await server.wait_for_termination()

asyncio.run(main())
"""

CLIENT = """
import asyncio, statistics, sys, time, grpc
from services.api import mux_pb2, mux_pb2_grpc

async def main(port, messages):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = mux_pb2_grpc.MuxStub(channel).Session()
        times = []
        for _ in range(messages + 50):
            start = time.perf_counter()
            await call.write(mux_pb2.MuxBatch())
            await call.read()
            times.append(time.perf_counter() - start)
        await call.done_writing()
    print(statistics.median(times[50:]) * 1e3)

asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
"""


def round_trip(experiments: str, messages: int) -> float:
    """Median echo round trip in ms between two fresh processes running with ``experiments``."""
    env = {**os.environ, "GRPC_EXPERIMENTS": experiments}
    server = subprocess.Popen([sys.executable, "-c", SERVER], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        done = subprocess.run([sys.executable, "-c", CLIENT, port, str(messages)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120, check=True)
        return float(done.stdout)
    finally:
        server.kill()
        server.wait()


def main() -> None:
    from services.common.grpc_io import POLLER_IO

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--messages", type=int, default=400)
    args = parser.parse_args()
    results: dict[str, list[float]] = {name: [] for name in ENGINES}
    for i in range(args.rounds):
        for name, experiments in ENGINES.items():
            results[name].append(round_trip(POLLER_IO if experiments is None else experiments, args.messages))
        print(f"round {i + 1}: " + ", ".join(f"{n} {v[-1]:.3f} ms" for n, v in results.items()), flush=True)
    ee, poller = (statistics.median(results[n]) for n in ENGINES)
    paired = statistics.median(p / e for p, e in zip(results["poller"], results["event-engine"], strict=True))
    print(f"bidi echo round trip p50: event-engine {ee:.3f} ms, poller {poller:.3f} ms; "
          f"ratio poller / event-engine {poller / ee:.2f} (paired {paired:.2f})")


if __name__ == "__main__":
    main()
