"""Metric 6: the same long-prompt trace through Dynamo's offline simulator and ``harnessmesh replay``.

Both run as whole processes (interpreter start + imports + replay) and are timed from outside with the
same clock. The trace comes from ``bench/long_trace.py`` (written alongside this bench); should that
module be missing, :func:`workload.fallback_long_trace` stands in and the JSON output says so.
"""

from __future__ import annotations

import compileall
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.dynamo_peer.workload import fallback_long_trace

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ReplayConfig:
    """Simulated mesh of both simulators: 4 workers whose KV caches the long trace overflows."""

    workers: int = 4
    block_size: int = 64
    num_blocks: int = 4096
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    overlap_weight: float = 1.0  # Dynamo's default; harnessmesh's cost formula takes the same weight
    trace_block: int = 512


def long_trace(path: Path) -> tuple[Path, str]:
    """Write the trace to ``path``; return it and a description of where it came from."""
    try:
        from bench.long_trace import generate
        lines = generate(sessions=32, turns=40, max_prompt=100_000, concurrency=16, system_tokens=12_000, seed=0)
        source = "bench/long_trace.py (32 sessions x 40 turns, prompts to 100k, seed 0)"
    except ImportError:
        lines = fallback_long_trace()
        source = "fallback_long_trace (bench/long_trace.py missing)"
    with path.open("w", encoding="utf-8") as fh:
        for line in lines:
            fh.write(json.dumps(line) + "\n")
    prompts = [int(line["input_length"]) for line in lines]  # type: ignore[call-overload]
    return path, f"{source}: {len(lines)} requests, max prompt {max(prompts):,} tokens"


@dataclass(frozen=True)
class Timed:
    """A replay process: wall seconds, CPU seconds (user + system, its whole tree), its stdout."""

    wall: float
    cpu: float
    stdout: str


def _timed(argv: list[str], env: dict[str, str] | None = None) -> Timed:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # children waited for: this one (and its own)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:3]} exited {done.returncode}: {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Timed(wall, cpu, done.stdout)


def run_dynamo_replay(python: Path, trace: Path, cfg: ReplayConfig) -> tuple[Timed, dict[str, Any]]:
    env = {**os.environ, "DYN_LOG": "warn"}
    done = _timed([str(python), str(Path(__file__).with_name("dynamo_replay.py")), str(trace),
                        json.dumps(asdict(cfg))], env)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    keep = ("completed_requests", "prefix_cache_reused_ratio", "median_ttft_ms", "mean_ttft_ms", "p99_ttft_ms",
            "duration_ms", "wall_time_ms")
    return done, {k: summary.get(k) for k in keep}


def compile_repo() -> None:
    """Write our packages' bytecode caches once, as a pip install does for Dynamo's (and every wheel's):
    with ``PYTHONDONTWRITEBYTECODE`` set, each replay process would otherwise compile them anew."""
    for package in ("services", "gateway"):
        compileall.compile_dir(ROOT / package, quiet=1)


def run_harnessmesh_replay(trace: Path, cfg: ReplayConfig) -> tuple[Timed, dict[str, Any]]:
    compile_repo()  # untimed; a no-op once the caches are current
    done = _timed([sys.executable, "-m", "services.launcher", "replay", str(trace),
                        "--workers", str(cfg.workers), "--router", "kv", "--block-size", str(cfg.block_size),
                        "--num-blocks", str(cfg.num_blocks), "--max-num-seqs", str(cfg.max_num_seqs),
                        "--max-num-batched-tokens", str(cfg.max_num_batched_tokens),
                        "--overlap-weight", str(cfg.overlap_weight), "--json"])
    return done, json.loads(done.stdout.strip().splitlines()[-1])
