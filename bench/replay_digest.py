"""A fingerprint of one simulated replay, finer than ``harnessmesh replay --json``: to prove a faster simulator exact.

    python bench/replay_digest.py TRACE.jsonl [--workers 4] [--num-blocks 2048] [--router kv] [--limit N]
                                  [--overlap-weight W] [--[no-]retention] [--out FILE]

Prints (or writes) one JSON object: the replay's summary (``ReplayResult.as_json``), a hash of every
request's record (arrival, worker, first-token and finish times as exact float reprs, output and cached
tokens), per worker a hash of its whole KV event stream (in emission order), its preemptions and engine
steps, and the run's wall seconds (the only field that may differ between two runs). Compare two outputs
with everything but ``wall_s``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.kvcore import domain as eng
from services.replay.sim_worker import SimWorkerConfig
from services.replay.simulator import Replay, ReplayConfig
from services.replay.trace import load_trace


class _DigestReplay(Replay):
    """A replay that also hashes every KV event each worker emits."""

    def __init__(self, config: ReplayConfig) -> None:
        super().__init__(config)
        self.event_hashes = {wid: hashlib.sha256() for wid in self.workers}

    def _on_events(self, worker_id: str, events: list[eng.KvEvent]) -> None:
        digest = self.event_hashes[worker_id]
        for e in events:
            digest.update(repr(e).encode())
        super()._on_events(worker_id, events)


def digest(trace_path: str, config: ReplayConfig, limit: int = 0) -> dict[str, Any]:
    trace = load_trace(trace_path, limit)
    sim = _DigestReplay(config)
    t0 = time.perf_counter()
    result = sim.run(trace)
    wall = time.perf_counter() - t0
    records = hashlib.sha256()
    for r in sim.records:
        records.update(repr((r.request_id, r.arrival_ms, r.prompt_tokens, r.max_tokens, r.worker_id,
                             r.first_token_ms, r.finish_ms, r.output_tokens, r.cached_tokens)).encode())
    workers = {wid: {"events": sim.event_hashes[wid].hexdigest()[:16],
                     "preemptions": w.scheduler.preemptions, "steps": w.core.steps}
               for wid, w in sim.workers.items()}
    return {"summary": result.as_json(), "records": records.hexdigest()[:16], "workers": workers,
            "end_ms": repr(sim.now), "wall_s": round(wall, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--num-blocks", type=int, default=2048)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--router", default="kv")
    ap.add_argument("--overlap-weight", type=float, default=None)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--out", default="")
    ap.add_argument("--retention", action=argparse.BooleanOptionalAction, default=None,
                    help="agent traces: the workers' retention (default: the replay's)")
    args = ap.parse_args()
    worker = SimWorkerConfig(block_size=args.block_size, num_blocks=args.num_blocks)
    extra: dict[str, float | bool] = {} if args.overlap_weight is None else {"overlap_weight": args.overlap_weight}
    if args.retention is not None:
        extra["retention"] = args.retention
    config = ReplayConfig(workers=args.workers, mode=args.router, worker=worker, **extra)
    text = json.dumps(digest(args.trace, config, args.limit), indent=1, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
