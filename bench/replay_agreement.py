"""Simulator vs live mesh: the same Mooncake trace slice through ``harnessmesh replay`` and ``--live``.

    python bench/replay_agreement.py [--trace PATH] [--limit 300] [--workers 2] [--compression 2] [--json]

For each routing mode (``kv``, ``round-robin``) it runs the discrete-event simulator, then starts a live
mesh (nats-server, router, mocker workers with ``--timing-model dynamo --speedup C``) and replays the same
requests (the same synthetic tokens) at time-compression ``C``, and prints both results and the ratios
live/sim of prefix reuse, TTFT p50/mean, TPOT mean and throughput.

After each live replay, on the now idle mesh, it sends a few cold probe requests (fresh hash ids, the
slice's mean prompt length) and compares their TTFT with the simulator's for the same probes: the
difference is the real processes' own per-request cost (gRPC hops, protobuf, block hashing in Python),
in simulated ms (wall ms x C), which the simulator does not model and which grows with ``C``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.launcher.live_mesh import LiveMeshConfig, live_mesh
from services.replay.live import replay_live
from services.replay.metrics import ReplayResult
from services.replay.sim_worker import SimWorkerConfig
from services.replay.simulator import ReplayConfig, replay
from services.replay.trace import TraceRequest, load_trace
from tests.support.fixtures import CONVERSATION_TRACE

DEFAULT_TRACE = CONVERSATION_TRACE  # the trace's first 1,000 requests (tests/fixtures/SOURCES.md)
PROBE_BASE = 3_000_000  # hash ids far above the trace's: probes share nothing with it or each other


def probes(trace: list[TraceRequest], count: int = 3, gap_ms: float = 4000.0) -> list[TraceRequest]:
    length = sum(r.input_length for r in trace) // max(len(trace), 1)
    blocks = -(-length // 512)
    return [TraceRequest(i * gap_ms, length, 2, tuple(range(PROBE_BASE + i * blocks, PROBE_BASE + (i + 1) * blocks)))
            for i in range(count)]


def ratios(live: ReplayResult, sim: ReplayResult) -> dict[str, float]:
    def r(a: float, b: float) -> float:
        return round(a / b, 3) if b else float("nan")

    return {"prefix_reuse": r(live.prefix_reuse, sim.prefix_reuse),
            "ttft_p50": r(live.ttft_ms["p50"], sim.ttft_ms["p50"]),
            "ttft_mean": r(live.ttft_ms["mean"], sim.ttft_ms["mean"]),
            "tpot_mean": r(live.tpot_ms["mean"], sim.tpot_ms["mean"]),
            "throughput": r(live.throughput_tok_s, sim.throughput_tok_s)}


async def run_live(
    trace: list[TraceRequest], config: LiveMeshConfig, speedup: float,
) -> tuple[ReplayResult, ReplayResult]:
    async with live_mesh(config) as mesh:
        result = await replay_live(trace, mesh.router_address, speedup, config.compression)
        probe = await replay_live(probes(trace), mesh.router_address, 1.0, config.compression)
    return result, probe


def compare(trace: list[TraceRequest], mode: str, ns: argparse.Namespace) -> dict[str, Any]:
    worker = SimWorkerConfig(ns.block_size, ns.num_blocks, ns.max_num_seqs, ns.max_num_batched_tokens)
    config = ReplayConfig(workers=ns.workers, mode=mode, worker=worker, speedup=ns.speedup)
    sim = replay(trace, config)
    sim_probe = replay(probes(trace), ReplayConfig(workers=ns.workers, mode=mode, worker=worker))
    mesh = LiveMeshConfig(workers=ns.workers, mode=mode, worker=worker, compression=ns.compression,
                          log_dir=f"{ns.log_dir}/{mode}" if ns.log_dir else "")
    started = time.monotonic()
    live, live_probe = asyncio.run(run_live(trace, mesh, ns.speedup))
    return {
        "router": mode, "sim": sim.as_json(), "live": live.as_json(), "live_over_sim": ratios(live, sim),
        "live_wall_s": round(time.monotonic() - started, 1),
        "probe_overhead_ms": round(live_probe.ttft_ms["mean"] - sim_probe.ttft_ms["mean"], 1),
    }


def show(row: dict[str, Any]) -> None:
    print(f"== {row['router']}  (live mesh wall time {row['live_wall_s']} s)")
    for side in ("sim", "live"):
        r = row[side]
        t, p = r["ttft_ms"], r["tpot_ms"]
        print(f"  {side:4} reuse={r['prefix_reuse']:.4f} ttft mean={t['mean']:.1f} p50={t['p50']:.1f} "
              f"p90={t['p90']:.1f} p99={t['p99']:.1f}  tpot mean={p['mean']:.2f} p50={p['p50']:.2f}  "
              f"throughput={r['throughput_tok_s']:.0f} tok/s failed={r['failed']}")
    print("  live/sim " + " ".join(f"{k}={v}" for k, v in row["live_over_sim"].items()))
    print(f"  live per-request overhead on an idle mesh (cold probes, simulated ms): {row['probe_overhead_ms']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--limit", type=int, default=300, help="first N requests of the trace (default 300)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--compression", type=float, default=2.0, help="simulated seconds per wall second (default 2)")
    ap.add_argument("--speedup", type=float, default=1.0, help="divide the trace's arrival gaps (both sides)")
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--num-blocks", type=int, default=16384)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--modes", default="kv,round-robin")
    ap.add_argument("--json", action="store_true", help="one JSON object per mode")
    ap.add_argument("--log-dir", default="", help="keep the live mesh processes' logs here")
    ns = ap.parse_args()
    trace = load_trace(ns.trace, ns.limit)
    span = (trace[-1].timestamp_ms - trace[0].timestamp_ms) / 1000.0 if trace else 0.0
    if not ns.json:
        print(f"{len(trace)} requests ({span:.0f} s of trace), {ns.workers} workers x {ns.num_blocks} blocks x "
              f"{ns.block_size} tokens, Dynamo timing, compression {ns.compression}x "
              f"(~{span / ns.speedup / ns.compression:.0f} s of wall time per mode)", flush=True)
    for mode in ns.modes.split(","):
        row = compare(trace, mode.strip(), ns)
        if ns.json:
            print(json.dumps(row), flush=True)
        else:
            show(row)


if __name__ == "__main__":
    main()
