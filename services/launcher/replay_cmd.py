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
import json
import os
from typing import TYPE_CHECKING

from services.common.settings import add_arguments, settings_from_namespace
from services.replay.settings import ReplaySettings

if TYPE_CHECKING:
    from services.replay.metrics import ReplayResult
    from services.replay.trace import TraceRequest


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``replay`` on the ``harnessmesh`` subcommands."""
    p = commands.add_parser("replay", help="replay a Mooncake trace (simulated, or against a live router)",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="JSONL trace: {timestamp, input_length, output_length, hash_ids} per line")
    add_arguments(p, ReplaySettings, "replay", os.environ)


def run(ns: argparse.Namespace) -> int:
    """Replay ``ns.trace`` in every mode of ``--router``; invalid options exit with their message."""
    from services.replay.simulator import ReplayConfig, replay
    from services.replay.trace import load_trace

    try:
        s = settings_from_namespace(ReplaySettings, ns)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    trace = load_trace(ns.trace, s.limit)
    if s.router_address or s.live:  # the simulator alone needs neither asyncio nor gRPC
        import asyncio

        from services.replay.live import replay_live
    if s.router_address:
        result = asyncio.run(replay_live(trace, s.router_address, s.speedup, s.compression))
        _print("live", result, s.json)
        return 0
    if s.live:
        for mode in s.modes:
            _print(f"{mode} live", asyncio.run(_replay_live_mesh(s, mode, trace)), s.json)
        return 0
    worker = s.worker()
    for mode in s.modes:
        config = ReplayConfig(workers=s.workers, mode=mode, worker=worker, overlap_weight=s.overlap_weight,
                              temperature=s.router_temperature, speedup=s.speedup,
                              pending_prefix_ttl=s.pending_prefix_ttl, retention=s.retention,
                              footprint_window=s.footprint_window)
        _print(mode, replay(trace, config), s.json)
    return 0


async def _replay_live_mesh(s: ReplaySettings, mode: str, trace: list[TraceRequest]) -> ReplayResult:
    from services.launcher.live_mesh import LiveMeshConfig, live_mesh
    from services.replay.live import replay_live

    config = LiveMeshConfig(
        workers=s.workers, mode=mode, worker=s.worker(), overlap_weight=s.overlap_weight,
        temperature=s.router_temperature, compression=s.compression, pending_prefix_ttl=s.pending_prefix_ttl,
        log_dir=f"{s.log_dir}/{mode}" if s.log_dir else "")
    async with live_mesh(config) as mesh:
        return await replay_live(trace, mesh.router_address, s.speedup, s.compression)


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
