"""Router benchmark: the Mooncake conversation trace through the simulator, and the index on one core.

    python bench/router_bench.py [--trace PATH] [--limit N]

Prints (1) prefix reuse and TTFT/TPOT for ``kv`` vs ``round-robin`` with 8 workers of 16,384 blocks of
64 tokens (both modes run in parallel processes), and (2) KV index ingest rate (events/s, blocks/s) and
prefix-match latency p50/p99 at 100 and 2,048 matched blocks, measured in this process.
The default trace is the repository's slice (the first 1,000 requests, ideal reuse 0.21); pass the whole
``conversation_trace.jsonl`` from Mooncake's ``FAST25-release/traces`` as ``--trace`` to compare with
Dynamo's replay of the whole trace in the same setup: reuse 0.082 (round-robin) -> 0.205 (kv),
TTFT mean 321 -> 276 ms; ideal reuse 0.366.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.common.block_hash import sequence_hashes
from services.replay.trace import ideal_reuse, load_trace
from services.router.index import KvIndex, StoredEvent
from tests.support.fixtures import CONVERSATION_TRACE

DEFAULT_TRACE = CONVERSATION_TRACE  # the trace's first 1,000 requests (tests/fixtures/SOURCES.md)


def replay_modes(trace: Path, limit: int) -> dict[str, dict[str, object]]:
    procs = {}
    for mode in ("round-robin", "kv"):
        argv = [sys.executable, "-m", "services.launcher", "replay", str(trace), "--workers", "8",
                "--block-size", "64", "--num-blocks", "16384", "--router", mode, "--json"]
        if limit:
            argv += ["--limit", str(limit)]
        procs[mode] = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    out = {}
    for mode, proc in procs.items():
        stdout, _ = proc.communicate()
        out[mode] = json.loads(stdout.strip().splitlines()[-1])
    return out


def index_bench(workers: int = 8) -> dict[str, object]:
    rng = random.Random(0)
    # Ingest: 20,000 stored events of 16 blocks each (chained runs), spread over the workers.
    index = KvIndex()
    batches: list[tuple[str, list[StoredEvent]]] = []
    event_ids = dict.fromkeys((f"w{i}" for i in range(workers)), 0)
    for _ in range(2000):
        wid = f"w{rng.randrange(workers)}"
        events = []
        for _ in range(10):
            event_ids[wid] += 1
            events.append(StoredEvent(event_ids[wid], tuple(rng.getrandbits(64) for _ in range(16))))
        batches.append((wid, events))
    start = time.perf_counter()
    for wid, events in batches:
        index.apply(wid, events)
    took = time.perf_counter() - start
    n_events = sum(len(e) for _, e in batches)
    result: dict[str, object] = {"ingest_events_per_s": round(n_events / took),
                                 "ingest_blocks_per_s": round(n_events * 16 / took)}
    # Match: a prompt whose first N blocks are held by some workers.
    for depth in (100, 2048):
        tokens = [rng.randrange(1 << 31) for _ in range(depth * 64)]
        hashes = sequence_hashes(tokens, 64)
        for i in range(workers):
            index.apply(f"w{i}", [StoredEvent(event_ids[f"w{i}"] + 1, tuple(hashes[: depth * (i + 1) // workers]))])
            event_ids[f"w{i}"] += 1
        lat = []
        candidates = [f"w{i}" for i in range(workers)]
        for _ in range(200):
            t = time.perf_counter()
            index.overlaps(hashes, candidates)
            lat.append((time.perf_counter() - t) * 1e6)
        lat.sort()
        hash_lat = []
        for _ in range(20):
            t = time.perf_counter()
            sequence_hashes(tokens, 64)
            hash_lat.append((time.perf_counter() - t) * 1e6)
        result[f"match_{depth}_blocks_us"] = {"p50": round(statistics.median(lat), 1),
                                              "p99": round(lat[int(len(lat) * 0.99) - 1], 1),
                                              "hashing_p50": round(statistics.median(hash_lat), 1)}
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--limit", type=int, default=0, help="first N requests only (0: the whole trace)")
    ap.add_argument("--skip-replay", action="store_true")
    args = ap.parse_args()
    print(json.dumps({"index": index_bench()}), flush=True)
    if args.skip_replay:
        return
    trace = load_trace(args.trace, args.limit)
    print(json.dumps({"ideal_reuse_512_token_blocks": round(ideal_reuse(trace), 3), "requests": len(trace)}))
    t = time.perf_counter()
    results = replay_modes(args.trace, args.limit)
    for mode, res in results.items():
        print(json.dumps({"mode": mode, **res}), flush=True)
    print(json.dumps({"replay_wall_s": round(time.perf_counter() - t, 1)}))


if __name__ == "__main__":
    main()
