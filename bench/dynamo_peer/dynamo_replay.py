"""Run Dynamo's offline simulator on a Mooncake trace; print its summary as one JSON line.

Runs INSIDE the Dynamo side venv (never imported by the bench):
``DYNAMO_VENV/bin/python dynamo_replay.py TRACE CONFIG_JSON``, CONFIG_JSON holding
``{workers, block_size, num_blocks, max_num_seqs, max_num_batched_tokens, overlap_weight, trace_block}``.

``run_trace_replay(trace_files, *, extra_engine_args, router_config, num_workers, router_mode,
trace_block_size, ...)`` (dynamo/replay/api.py in 1.6.1): engine args are the mocker's launch config
(``{"engine": {...}}`` normalised by ``dynamo.mocker.config.normalize_mocker_config``), the router a
``KvRouterConfig``; ``router_mode="kv_router"`` is the kv router. Simulated time, so no speedup applies.
"""

import json
import sys

from dynamo._core import KvRouterConfig
from dynamo.mocker.config import normalize_mocker_config
from dynamo.replay.api import run_trace_replay


def main() -> None:
    trace, cfg = sys.argv[1], json.loads(sys.argv[2])
    engine = normalize_mocker_config({"engine": {
        "backend": "vllm", "worker_type": "aggregated", "block_size": cfg["block_size"],
        "num_gpu_blocks": cfg["num_blocks"], "max_num_seqs": cfg["max_num_seqs"],
        "max_num_batched_tokens": cfg["max_num_batched_tokens"], "enable_prefix_caching": True,
        "enable_chunked_prefill": True}})
    report = run_trace_replay(trace, extra_engine_args=engine, num_workers=cfg["workers"],
                              router_config=KvRouterConfig(overlap_score_weight=cfg["overlap_weight"]),
                              router_mode="kv_router", trace_block_size=cfg["trace_block"])
    print(json.dumps(dict(report.summary), default=str))


if __name__ == "__main__":
    main()
