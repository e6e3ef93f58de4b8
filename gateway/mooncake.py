"""Trace records -> a Mooncake trace for ``harnessmesh replay``: ``python -m gateway.mooncake IN [OUT]``.

Records hold token counts, never tokens, so prefix sharing is rebuilt from the agent's shape: each
turn of a trajectory is assumed to extend that trajectory's previous turn (prompt + output + new
messages), so it reuses the previous prompt's full 512-token blocks up to the tokens they share and
gets fresh hash ids for the rest; a trajectory's first turn starts fresh. Timestamps are milliseconds
since the first record; failed requests are skipped. Output lines are
``{"timestamp", "input_length", "output_length", "hash_ids"}`` (``services/replay/trace.py``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.trace_records import read_records

BLOCK = 512


@dataclass
class _Line:
    ids: list[int]
    shared_tokens: int  # prompt + output: what the next turn can reuse


def to_mooncake(records: Iterable[dict[str, Any]], block: int = BLOCK) -> list[dict[str, Any]]:
    """One Mooncake line per successful record, in arrival order."""
    ok = sorted((r for r in records if r.get("outcome", "ok") == "ok" and r.get("prompt_tokens")),
                key=lambda r: float(r["ts"]))
    if not ok:
        return []
    fresh = itertools.count()
    lines: dict[str, _Line] = {}
    start = float(ok[0]["ts"])
    out = []
    for record in ok:
        prompt, output = int(record["prompt_tokens"]), int(record.get("completion_tokens", 0))
        key = f"{record.get('session_id', '')}/{record.get('trajectory_id', '')}"
        previous = lines.get(key)
        blocks = -(-prompt // block)
        reused = []
        if previous is not None:
            full_previous_blocks = min(previous.shared_tokens, prompt) // block
            reused = previous.ids[:full_previous_blocks]
        ids = reused + [next(fresh) for _ in range(blocks - len(reused))]
        lines[key] = _Line(ids[: prompt // block], prompt + output)
        out.append({"timestamp": round((float(record["ts"]) - start) * 1000, 3), "input_length": prompt,
                    "output_length": max(output, 1), "hash_ids": ids})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.mooncake", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", help="trace record file (JSONL, .gz allowed)")
    parser.add_argument("out", nargs="?", default="-", help="Mooncake JSONL to write (default: stdout)")
    parser.add_argument("--block", type=int, default=BLOCK, help="tokens per hash id (default 512)")
    ns = parser.parse_args(argv)
    lines = to_mooncake(read_records(ns.records), ns.block)
    text = "".join(json.dumps(line) + "\n" for line in lines)
    if ns.out == "-":
        sys.stdout.write(text)
    else:
        with open(ns.out, "w", encoding="utf-8") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
