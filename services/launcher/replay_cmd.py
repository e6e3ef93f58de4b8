"""``harnessmesh replay TRACE.jsonl``: replay a Mooncake-format trace and print reuse, TTFT, TPOT, throughput.

Default: a discrete-event simulation in this process (no network) that drives the router's own core
(index, policy, load book-keeping) and the mocker's own core (block manager, scheduler) with Dynamo
mocker's polynomial timing. ``--speedup`` divides the trace's arrival gaps (more load) in every mode.

``--live`` replays the same trace against real processes instead: for each routing mode it starts
nats-server, a router and ``--workers`` mocker workers configured like the simulated ones (block size,
blocks, batching, ``--timing-model dynamo``), and runs the schedule ``--compression`` times faster than
simulated time (the workers' ``--speedup``; measured times are scaled back), so its figures sit beside the
simulator's. ``--router-address HOST:PORT`` targets a running router instead (its own mode); start its
workers with ``--timing-model dynamo --speedup C`` and pass ``--compression C``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import TYPE_CHECKING

from services.router.policy import DEFAULT_OVERLAP_WEIGHT, MODES

if TYPE_CHECKING:
    from services.replay.metrics import ReplayResult
    from services.replay.trace import TraceRequest


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("replay", help="replay a Mooncake trace (simulated, or against a live router)",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="JSONL trace: {timestamp, input_length, output_length, hash_ids} per line")
    p.add_argument("--workers", type=int, default=8, help="simulated workers (default 8)")
    p.add_argument("--router", default="kv", help=f"routing mode, or several comma-separated: {', '.join(MODES)}")
    p.add_argument("--block-size", type=int, default=64, help="tokens per KV block (default 64)")
    p.add_argument("--num-blocks", type=int, default=16384, help="KV blocks per worker (default 16384)")
    p.add_argument("--max-num-seqs", type=int, default=256, help="most requests per engine step (default 256)")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192, help="token budget per step (default 8192)")
    p.add_argument("--overlap-weight", type=float, default=DEFAULT_OVERLAP_WEIGHT,
                   help=f"kv cost weight of prefill blocks (default {DEFAULT_OVERLAP_WEIGHT})")
    p.add_argument("--router-temperature", type=float, default=0.0, help="softmax temperature of kv placement")
    p.add_argument("--speedup", type=float, default=1.0, help="divide the trace's arrival gaps by this factor")
    p.add_argument("--limit", type=int, default=0, help="replay only the first N requests (0: all)")
    p.add_argument("--live", action="store_true",
                   help="replay against a live mesh of mocker workers started for each mode instead of simulating")
    p.add_argument("--compression", type=float, default=1.0,
                   help="live: simulated seconds per wall-clock second (the workers' --speedup; default 1)")
    p.add_argument("--router-address", default="", help="replay against this live router instead of simulating")
    p.add_argument("--log-dir", default="", help="--live: keep the mesh processes' logs here")
    p.add_argument("--json", action="store_true", help="print one JSON object (per mode) instead of text")


def run(ns: argparse.Namespace) -> int:
    from services.replay.live import replay_live
    from services.replay.sim_worker import SimWorkerConfig
    from services.replay.simulator import ReplayConfig, replay
    from services.replay.trace import load_trace

    modes = [m.strip() for m in ns.router.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise SystemExit(f"unknown routing mode(s) {unknown}; valid modes: {', '.join(MODES)}")
    if ns.speedup <= 0 or ns.workers < 1 or ns.compression <= 0:
        raise SystemExit("--speedup and --compression must be > 0 and --workers >= 1")
    trace = load_trace(ns.trace, ns.limit)
    if ns.router_address:
        result = asyncio.run(replay_live(trace, ns.router_address, ns.speedup, ns.compression))
        _print("live", result, ns.json)
        return 0
    if ns.live:
        for mode in modes:
            _print(f"{mode} live", asyncio.run(_replay_live_mesh(ns, mode, trace)), ns.json)
        return 0
    worker = SimWorkerConfig(ns.block_size, ns.num_blocks, ns.max_num_seqs, ns.max_num_batched_tokens)
    for mode in modes:
        config = ReplayConfig(workers=ns.workers, mode=mode, worker=worker, overlap_weight=ns.overlap_weight,
                              temperature=ns.router_temperature, speedup=ns.speedup)
        _print(mode, replay(trace, config), ns.json)
    return 0


async def _replay_live_mesh(ns: argparse.Namespace, mode: str, trace: list[TraceRequest]) -> ReplayResult:
    from services.replay.live import replay_live
    from services.replay.live_mesh import LiveMeshConfig, live_mesh

    config = LiveMeshConfig(
        workers=ns.workers, mode=mode, block_size=ns.block_size, num_blocks=ns.num_blocks,
        max_num_seqs=ns.max_num_seqs, max_num_batched_tokens=ns.max_num_batched_tokens,
        overlap_weight=ns.overlap_weight, temperature=ns.router_temperature, compression=ns.compression,
        log_dir=f"{ns.log_dir}/{mode}" if ns.log_dir else "")
    async with live_mesh(config) as mesh:
        return await replay_live(trace, mesh.router_address, ns.speedup, ns.compression)


def _print(mode: str, result: ReplayResult, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"router": mode, **result.as_json()}), flush=True)
        return
    t, p = result.ttft_ms, result.tpot_ms
    print(f"[{mode}] requests={result.requests} prefix_reuse={result.prefix_reuse:.3f} "
          f"ttft_ms mean={t['mean']:.1f} p50={t['p50']:.1f} p90={t['p90']:.1f} p99={t['p99']:.1f} "
          f"tpot_ms mean={p['mean']:.2f} p50={p['p50']:.2f} p99={p['p99']:.2f} "
          f"throughput={result.throughput_tok_s:.0f} tok/s" + (f" failed={result.failed}" if result.failed else ""),
          flush=True)
