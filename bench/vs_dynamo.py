"""harnessmesh vs. NVIDIA Dynamo 1.6.1 (frontend + mocker) vs. a null SSE server, same client, one run (issue 12).

    python bench/vs_dynamo.py [--rounds 7] [--requests 40] [--only 1,2,3,4,5,6] [--json [FILE]]
                              [--dynamo-venv .bench/dynamo-venv]

The first run installs ai-dynamo 1.6.1 (CPU only, PyPI) into ``--dynamo-venv`` (~1 min, ~690 MB; see
``bench/dynamo_peer/venv.py``); later runs reuse it. Three stacks run side by side on loopback, all
simulating ~0 compute (mocker speedup 1000, Dynamo's polynomial timing on both sides), one worker each,
the same model dir (our demo tokenizer and chat template, 128k context), the same engine limits (block
size, blocks, max_num_seqs, batched tokens) and the kv router:

* ``null``: a trivial aiohttp SSE server (the client / loopback floor);
* ``dynamo``: ``python -m dynamo.frontend --router-mode kv`` + ``python -m dynamo.mocker``;
* ``harnessmesh``: ``harnessmesh up --workers 1`` (nats-server, router, worker, parse, gateway).

Each round runs every selected metric on null, dynamo, harnessmesh in turn (so drift hits all three);
the table shows medians over rounds, the ratio of those medians (judged against the issue's threshold) and,
as ``paired``, the median over rounds of each round's own ratio (less sensitive to load that drifts).
Metrics (numbers as in the issue):

1. CPU per request: utime + stime of every process of the stack (its whole process trees, from
   ``/proc``) over metric 2's window, divided by its requests. Ratio harnessmesh / dynamo.
2. TTFT p50 at concurrency 1 (``--requests`` requests, ~150-word prompt, 64 tokens, unique prompts);
   ratio: (harnessmesh - null) / (dynamo - null).
3. Requests/s at concurrency 8 (``--requests`` requests, same prompt shape, 64 tokens).
4. A tool-loop session's cached next turn: turn 1 is a ~4k / ~100k-token history (read_file calls and
   results), then the next turn (history + one more call + result) is sent and its TTFT is the "serving
   time to first token" (the prefix is cached; ~250 new tokens). Ratios: at 100k harnessmesh / dynamo,
   and harnessmesh at 100k / at 4k. Every TTFT's clock starts once the client has encoded the body
   (``client.stream_chat``): the client's own JSON encoding (~1.3 ms at 100k) is no part of serving.
5. Output tokens/s at concurrency 8 with 1,024-token outputs (``ignore_eos``; ``--decode-requests``).
6. Offline replay wall time of a long-prompt Mooncake trace (``bench/long_trace.py``: ~100k-token prompts,
   KV pressure): ``harnessmesh replay`` vs. ``dynamo.replay.api.run_trace_replay`` (in the side venv),
   each a whole process (interpreter start + import + replay), same workers / engine / router settings.
   Run after the live stacks are stopped. An info row gives each process's CPU seconds (user + system),
   which a loaded machine disturbs less than wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.dynamo_peer.client import Result, StreamError, client, run_concurrent, stream_chat
from bench.dynamo_peer.model import build_model_dir
from bench.dynamo_peer.peer import EngineConfig, Processes, start_dynamo, start_null
from bench.dynamo_peer.procstat import CpuMeter, tree_names
from bench.dynamo_peer.replay import ReplayConfig, long_trace, run_dynamo_replay, run_harnessmesh_replay
from bench.dynamo_peer.venv import DEFAULT_VENV, ensure_dynamo_venv
from bench.dynamo_peer.workload import chat_body, short_prompt, tokens_per_word, tool_loop_session
from tests.support.mesh import running_mesh

MODEL = "bench-model"
STACKS = ("null", "dynamo", "harnessmesh")
SESSION_SIZES = (4_000, 100_000)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Stack:
    name: str
    url: str
    roots: list[int]  # process-tree roots whose CPU is this stack's
    http: httpx.AsyncClient = field(init=False)


@dataclass
class Samples:
    """metric key -> stack -> one value per round (None: the round failed on that stack)."""

    values: dict[str, dict[str, list[float | None]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, key: str, stack: str, value: float | None) -> None:
        self.values.setdefault(key, {}).setdefault(stack, []).append(value)

    def median(self, key: str, stack: str) -> float | None:
        vals = [v for v in self.values.get(key, {}).get(stack, []) if v is not None]
        return statistics.median(vals) if vals else None

    def round(self, i: int) -> Samples:
        """Only round ``i``'s values (for ratios paired within a round)."""
        out = Samples()
        for key, per_stack in self.values.items():
            for stack, vals in per_stack.items():
                if i < len(vals):
                    out.add(key, stack, vals[i])
        return out

    def rounds(self) -> int:
        return max((len(v) for per in self.values.values() for v in per.values()), default=0)

    def failed(self, key: str, stack: str) -> int:
        return sum(v is None for v in self.values.get(key, {}).get(stack, []))


# --- one measurement of one stack --------------------------------------------------------------------

async def short_requests(stack: Stack, requests: int, concurrency: int, max_tokens: int) -> tuple[list[Result], float]:
    def one() -> Any:
        return stream_chat(stack.http, chat_body(MODEL, [{"role": "user", "content": short_prompt()}], max_tokens))
    return await run_concurrent(one, requests, concurrency)


async def metric_ttft_cpu(stack: Stack, args: argparse.Namespace, s: Samples) -> None:
    with CpuMeter(stack.roots) as cpu:
        results, _ = await short_requests(stack, args.requests, 1, 64)
    s.add("cpu", stack.name, cpu.seconds / len(results) * 1e3)
    s.add("ttft", stack.name, statistics.median(r.ttft for r in results) * 1e3)
    s.extra.setdefault("ttft_prompt_tokens", {})[stack.name] = results[0].prompt_tokens


async def metric_rps(stack: Stack, args: argparse.Namespace, s: Samples) -> None:
    results, wall = await short_requests(stack, args.requests, 8, 64)
    s.add("rps", stack.name, len(results) / wall)


async def metric_decode(stack: Stack, args: argparse.Namespace, s: Samples) -> None:
    results, wall = await short_requests(stack, args.decode_requests, 8, 1024)
    tokens = sum(r.completion_tokens for r in results)
    if stack.name != "null" and any(r.completion_tokens != 1024 for r in results):
        s.errors.append(f"{stack.name}: 1,024-token run got {sorted({r.completion_tokens for r in results})} tokens")
    s.add("tok_s", stack.name, tokens / wall)


async def metric_session(stack: Stack, size: int, seed: int, tpw: float, s: Samples) -> None:
    turn1, next_turn = tool_loop_session(size, tpw, seed)
    try:
        first = await stream_chat(stack.http, chat_body(MODEL, turn1, 16, tools=True))
        cached = await stream_chat(stack.http, chat_body(MODEL, next_turn, 16, tools=True))
    except (StreamError, httpx.HTTPError) as exc:
        s.add(f"session_{size}", stack.name, None)
        s.errors.append(f"{stack.name} session ~{size:,} tokens: {type(exc).__name__}: {str(exc)[:300]}")
        return
    s.add(f"session_{size}", stack.name, cached.ttft * 1e3)
    s.add(f"session_{size}_turn1", stack.name, first.ttft * 1e3)
    s.extra.setdefault("session_prompt_tokens", {}).setdefault(str(size), {})[stack.name] = [
        first.prompt_tokens, cached.prompt_tokens]


# --- the run -----------------------------------------------------------------------------------------

async def _session_phase(st: Stack, *, size: int, seed: int, tpw: float, s: Samples) -> None:
    await metric_session(st, size, seed, tpw, s)  # same seed on every stack: the same conversation


async def live_rounds(stacks: list[Stack], args: argparse.Namespace, only: set[int], tpw: float, s: Samples) -> None:
    for st in stacks:
        st.http = client(st.url)
    try:
        for st in stacks:  # warm-up: connections, tokenizer, first-request paths
            await short_requests(st, 8, 4, 64)
            if 4 in only:
                await metric_session(st, 4_000, -1, tpw, Samples())
        for rnd in range(args.rounds):
            log(f"round {rnd + 1}/{args.rounds}")
            phases: list[Callable[[Stack], Any]] = []
            if only & {1, 2}:
                phases.append(lambda st: metric_ttft_cpu(st, args, s))
            if 3 in only:
                phases.append(lambda st: metric_rps(st, args, s))
            if 5 in only:
                phases.append(lambda st: metric_decode(st, args, s))
            if 4 in only:
                for size in SESSION_SIZES:
                    phases.append(functools.partial(_session_phase, size=size, seed=rnd * 1000 + size, tpw=tpw, s=s))
            for phase in phases:
                for st in stacks:
                    await phase(st)
    finally:
        for st in stacks:
            await st.http.aclose()


def mesh_args(model: Path, cfg: EngineConfig) -> list[str]:
    return ["--workers", str(cfg.workers), "--speedup", str(cfg.speedup), "--timing-model", "dynamo",
            "--served-model-name", MODEL, "--model", str(model), "--max-model-len", str(cfg.context),
            "--block-size", str(cfg.block_size), "--num-blocks", str(cfg.num_blocks),
            "--max-num-seqs", str(cfg.max_num_seqs), "--max-num-batched-tokens", str(cfg.max_num_batched_tokens),
            "--router-mode", "kv", "--log-level", "warning"]


def run_live(args: argparse.Namespace, only: set[int], python: Path, tmp: Path, s: Samples) -> None:
    cfg = EngineConfig()
    model = build_model_dir(tmp / "model", cfg.context)
    tpw = tokens_per_word(str(model / "tokenizer.json"))
    procs = Processes(tmp)
    with ExitStack() as stack:
        stack.callback(procs.stop)
        log("starting null SSE server, Dynamo frontend + mocker, harnessmesh up")
        null_url = start_null(procs, python)
        dyn_url = start_dynamo(procs, python, model, MODEL, cfg)
        mesh = stack.enter_context(running_mesh(mesh_args(model, cfg), tmp / "harnessmesh.log"))
        stacks = [
            Stack("null", null_url, [procs.procs["null-sse"].pid]),
            Stack("dynamo", dyn_url, [procs.procs["dynamo-frontend"].pid, procs.procs["dynamo-mocker"].pid]),
            Stack("harnessmesh", mesh.http, [mesh.process.pid]),
        ]
        s.extra["processes"] = {st.name: tree_names(st.roots) for st in stacks}
        log("all up; load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
        s.extra["load_before"] = os.getloadavg()
        asyncio.run(live_rounds(stacks, args, only, tpw, s))
        s.extra["load_after"] = os.getloadavg()
        s.extra["engine"] = cfg.__dict__


def run_replay(args: argparse.Namespace, python: Path, tmp: Path, s: Samples) -> None:
    cfg = ReplayConfig()
    trace, source = long_trace(tmp / "long_trace.jsonl")
    s.extra["replay_trace"] = source
    s.extra["replay_config"] = cfg.__dict__
    log(f"replay trace: {source}")
    for rnd in range(args.replay_rounds):
        log(f"replay round {rnd + 1}/{args.replay_rounds}")
        for name in ("dynamo", "harnessmesh"):
            try:
                done, summary = (run_dynamo_replay(python, trace, cfg) if name == "dynamo"
                                 else run_harnessmesh_replay(trace, cfg))
            except (subprocess.CalledProcessError, RuntimeError) as exc:
                s.add("replay", name, None)
                s.add("replay_cpu", name, None)
                s.errors.append(f"{name} replay: {str(exc)[-500:]}")
                continue
            s.add("replay", name, done.wall)
            s.add("replay_cpu", name, done.cpu)
            s.extra.setdefault("replay_summary", {})[name] = summary


# --- the table ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    metric: int
    label: str
    key: str
    unit: str
    threshold: str
    ratio: Callable[[Samples], float | None]
    ok: Callable[[float], bool]
    cells: Callable[[Samples, str], float | None] | None = None


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _above_null(s: Samples, key: str) -> float | None:
    n, d, h = (s.median(key, x) for x in STACKS)
    return _div(None if h is None or n is None else h - n, None if d is None or n is None else d - n)


def _self_ratio(s: Samples, stack: str) -> float | None:
    return _div(s.median("session_100000", stack), s.median("session_4000", stack))


ROWS = [
    Row(1, "CPU per request (all processes)", "cpu", "ms", "<= 2.0",
        lambda s: _div(s.median("cpu", "harnessmesh"), s.median("cpu", "dynamo")), lambda r: r <= 2.0),
    Row(2, "TTFT p50, conc 1 (ratio above null)", "ttft", "ms", "<= 2.0",
        lambda s: _above_null(s, "ttft"), lambda r: r <= 2.0),
    Row(3, "requests/s, conc 8", "rps", "req/s", ">= 0.7",
        lambda s: _div(s.median("rps", "harnessmesh"), s.median("rps", "dynamo")), lambda r: r >= 0.7),
    Row(4, "cached next turn TTFT @~4k", "session_4000", "ms", "(info)",
        lambda s: _div(s.median("session_4000", "harnessmesh"), s.median("session_4000", "dynamo")),
        lambda r: True),
    Row(4, "cached next turn TTFT @~100k", "session_100000", "ms", "<= 1.5",
        lambda s: _div(s.median("session_100000", "harnessmesh"), s.median("session_100000", "dynamo")),
        lambda r: r <= 1.5),
    Row(4, "same stack: @100k / @4k", "session_self", "x", "<= 2.0",
        lambda s: _self_ratio(s, "harnessmesh"), lambda r: r <= 2.0, cells=_self_ratio),
    Row(5, "output tok/s, conc 8, 1,024 tok", "tok_s", "tok/s", ">= 0.8",
        lambda s: _div(s.median("tok_s", "harnessmesh"), s.median("tok_s", "dynamo")), lambda r: r >= 0.8),
    Row(6, "replay wall, long trace", "replay", "s", "<= 2.0",
        lambda s: _div(s.median("replay", "harnessmesh"), s.median("replay", "dynamo")), lambda r: r <= 2.0),
    Row(6, "replay CPU (user+sys), long trace", "replay_cpu", "s", "(info)",
        lambda s: _div(s.median("replay_cpu", "harnessmesh"), s.median("replay_cpu", "dynamo")), lambda r: True),
]


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"


def table(s: Samples, only: set[int]) -> tuple[str, list[dict[str, Any]]]:
    rows: list[dict[str, Any]] = []
    for row in ROWS:
        if row.metric not in only:
            continue
        cells = {st: (row.cells(s, st) if row.cells else s.median(row.key, st)) for st in STACKS}
        failed = {st: s.failed(row.key, st) for st in STACKS} if not row.cells else {}
        ratio = row.ratio(s)
        paired = [r for r in (row.ratio(s.round(i)) for i in range(s.rounds())) if r is not None]
        verdict = "n/a" if row.threshold == "(info)" else "FAIL" if ratio is None or not row.ok(ratio) else "pass"
        if any(failed.values()) and verdict != "n/a":
            verdict = "FAIL"
        rows.append({"metric": row.metric, "label": row.label, "unit": row.unit, **cells, "ratio": ratio,
                     "ratio_paired": statistics.median(paired) if paired else None,
                     "threshold": row.threshold, "verdict": verdict,
                     "failed_rounds": {k: v for k, v in failed.items() if v}})
    head = f"{'#':<2} {'metric':<38} {'unit':<6} {'null':>8} {'dynamo':>8} {'harnessmesh':>11} " \
           f"{'ratio':>7} {'paired':>7} {'threshold':>9} {'':>4}"
    lines = [head, "-" * len(head)]
    for r in rows:
        hm = _fmt(r["harnessmesh"]) + (f" ({sum(r['failed_rounds'].values())}F)" if r["failed_rounds"] else "")
        lines.append(f"{r['metric']:<2} {r['label']:<38} {r['unit']:<6} {_fmt(r['null']):>8} {_fmt(r['dynamo']):>8} "
                     f"{hm:>11} {_fmt(r['ratio']):>7} {_fmt(r['ratio_paired']):>7} {r['threshold']:>9} "
                     f"{r['verdict']:>4}")
    return "\n".join(lines), rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7, help="alternating rounds of metrics 1-5")
    ap.add_argument("--requests", type=int, default=40, help="requests per round for metrics 1-3")
    ap.add_argument("--decode-requests", type=int, default=16, help="1,024-token requests per round (metric 5)")
    ap.add_argument("--replay-rounds", type=int, default=3, help="alternating rounds of metric 6")
    ap.add_argument("--only", default="1,2,3,4,5,6", help="comma-separated metric numbers to run")
    ap.add_argument("--dynamo-venv", type=Path, default=DEFAULT_VENV, help="side venv with ai-dynamo (made once)")
    ap.add_argument("--json", nargs="?", const="-", default="", metavar="FILE",
                    help="write one JSON object to FILE (and print the table), or alone: print it instead of the table")
    args = ap.parse_args()
    only = {int(x) for x in args.only.split(",") if x.strip()}
    python = ensure_dynamo_venv(args.dynamo_venv, log=log)
    s = Samples()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vs-dynamo-") as tmp:
        if only & {1, 2, 3, 4, 5}:
            run_live(args, only, python, Path(tmp), s)
        if 6 in only:
            run_replay(args, python, Path(tmp), s)
    text, rows = table(s, only)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True, cwd=Path(__file__).parent).stdout.split("\n")
    meta = {"commit": head, "modified": [line[3:] for line in dirty if line.strip()],
            "rounds": args.rounds, "requests": args.requests,
            "decode_requests": args.decode_requests, "replay_rounds": args.replay_rounds, "cpus": os.cpu_count(),
            "load_end": [round(x, 2) for x in os.getloadavg()], "wall_s": round(time.monotonic() - t0, 1)}
    report = json.dumps({"meta": meta, "rows": rows, "per_round": s.values, "errors": s.errors, **s.extra},
                        default=str, indent=1)
    if args.json == "-":
        print(report)
    else:
        if args.json:
            Path(args.json).write_text(report + "\n")
        print(f"vs_dynamo: {meta}")
        print(text)
        for err in s.errors:
            print(f"error: {err}")
    return 0 if all(r["verdict"] != "FAIL" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
