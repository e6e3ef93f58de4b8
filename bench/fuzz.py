"""No 5xx on bad input (issue 14): fuzzed requests against a real ``harnessmesh up``, every endpoint.

    python bench/fuzz.py [--requests 10000] [--seed 14] [--lanes 4] [--json]

Requests are generated from a fixed seed (``tests/fuzz/``): valid requests of each API mutated structurally
(wrong types, missing and extra fields, huge / negative / NaN / infinite numbers, ints past 2^63, deep
nesting, lone surrogates, invalid UTF-8, empty and enormous strings, wrong roles, bad tool schemas and
content parts, bad headers and keys), raw invalid JSON, streaming and not, to ``/v1/chat/completions``,
``/v1/messages``, ``/v1/messages/count_tokens``, ``/v1/responses``, ``/tokenize``, ``/detokenize``, and
``AgentService.Chat`` on the gRPC edge (odd requests and bytes that are no ``ChatRequest``).

Checked: no status >= 500; every error body in its API's own shape; event streams well framed, with no
in-band server error; after every 50th request of a connection a valid one on that same keep-alive connection
succeeds; gRPC statuses of the client-error kind (not UNKNOWN / INTERNAL); every mesh process still up (same
pids) at the end. Prints counts per endpoint and status, each finding with a reproducer excerpt (the case
index reproduces it with the same ``--seed``), and the wall time. Exits 1 on any finding.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fuzz.drive import API_KEY, MESH_ARGS, MESH_ENV, mesh_processes, processes_lost, run, summary
from tests.support.mesh import running_mesh


def fuzz(requests: int, seed: int, lanes: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "mesh.log"
        with running_mesh(MESH_ARGS, log, env=MESH_ENV) as mesh:
            before = mesh_processes(mesh.process.pid)
            tally, wall = asyncio.run(run(mesh.http, mesh.grpc, requests=requests, seed=seed, api_key=API_KEY,
                                          lanes=lanes))
            lost = processes_lost(before, mesh.process.poll() is None, mesh_processes(mesh.process.pid))
    out = summary(tally)
    five = Counter(where for (where, status), n in tally.statuses.items() for _ in range(n)
                   if status.isdigit() and int(status) >= 500)
    out.update({"seed": seed, "wall_s": round(wall, 2), "requests_per_s": round(tally.requests / wall, 1),
                "status_5xx": sum(five.values()), "processes_lost": lost,
                "finding_list": [f.as_dict() for f in tally.findings]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=10_000, help="fuzzed requests (follow-ups not counted)")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--lanes", type=int, default=4, help="concurrent HTTP connections")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    result = fuzz(args.requests, args.seed, args.lanes)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{result['requests']} requests, seed {result['seed']}, {result['wall_s']} s "
              f"({result['requests_per_s']} req/s); follow-ups on the same connection: "
              f"{result['follow_ups_same_connection']}/{result['follow_ups']}")
        for where, statuses in result["by_endpoint"].items():
            print(f"  {where:34} " + "  ".join(f"{status}: {n}" for status, n in statuses.items()))
        print(f"5xx: {result['status_5xx']}; findings: {result['findings']}; processes lost: "
              f"{result['processes_lost'] or 'none'}")
        for finding in result["finding_list"][:50]:
            print(f"- #{finding['index']} {finding['where']}: {finding['problem'][:300]}\n"
                  f"    mutations {finding['mutations']}\n    request {finding['request_excerpt'][:400]}")
    sys.exit(1 if result["findings"] or result["processes_lost"] else 0)


if __name__ == "__main__":
    main()
