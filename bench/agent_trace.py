"""Real coding-agent traces -> replay traces: slices of kv-cache-tester's Claude Code sessions (issue 35).

    python bench/agent_trace.py SOURCE_DIR OUT.jsonl [--sessions 120] [--window 1800] [--horizon 3600]
                                [--max-gap 300] [--max-context 128000] [--seed 0]

``SOURCE_DIR`` holds kv-cache-tester trace files (``traces/trace_NNNN.json`` of github.com/callanjfox/
kv-cache-tester, Apache-2.0): one Claude Code conversation each, requests ``{t, in, out, hash_ids, stop,
...}`` with 64-token block hash ids local to the file (each id names its whole prefix), and sub-agents as
``{type: "subagent", t, agent_id, requests: [...]}`` whose request times count from the sub-agent's start.

A slice: ``--sessions`` conversations drawn with ``--seed``, each starting at a uniform offset in
``[0, --window)`` seconds; inside a conversation (sub-agents flattened onto its clock) every gap between
consecutive requests is capped at ``--max-gap`` seconds (the traces hold idle gaps of hours); requests past
``--horizon`` seconds, and a conversation's requests from its first prompt over ``--max-context`` tokens on,
are dropped; a prompt's last partial 64-token block (no id) is cut. The output is a Mooncake line per
request (``timestamp`` ms, ``input_length``,
``output_length``, ``hash_ids``) plus ``session`` (``trace_0010`` or ``trace_0010/agent_001``) and ``stop``
(``tool_use``, ``end_turn`` or ``""``), which both replays ignore.

Hash ids: the replays synthesise 512-token trace blocks, so each group of 8 consecutive 64-token ids becomes
one id, named by the group's last id and its length (a prefix id names its prefix, so equal groups get equal
ids); ids are made distinct across conversations. A divergence inside a 512-token group loses that group's
reuse in both simulators alike.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

SOURCE_BLOCK = 64
TRACE_BLOCK = 512
GROUP = TRACE_BLOCK // SOURCE_BLOCK


@dataclass(frozen=True)
class AgentRequest:
    """One request of a conversation, on the conversation's own clock (seconds)."""

    t: float
    session: str
    input_length: int
    output_length: int
    source_ids: tuple[int, ...]
    stop: str


def flatten(trace: dict[str, object]) -> list[AgentRequest]:
    """The conversation's requests and its sub-agents' requests on one clock, in time order."""
    name = str(trace.get("id", "trace"))
    out: list[AgentRequest] = []

    def walk(requests: Iterable[dict[str, object]], session: str, base: float) -> None:
        for req in requests:
            if req.get("type") == "subagent":
                nested = req.get("requests")
                if isinstance(nested, list):
                    walk(nested, f"{name}/{req.get('agent_id', 'agent')}", base + float(req["t"]))  # type: ignore[arg-type]
                continue
            ids = tuple(req["hash_ids"])  # type: ignore[arg-type]
            # a prompt's last partial block has no id: cut it (< 64 tokens) so the ids cover the prompt
            prompt = min(int(req["in"]), len(ids) * SOURCE_BLOCK)  # type: ignore[call-overload]
            out.append(AgentRequest(base + float(req["t"]), session, prompt, int(req.get("out", 1)) or 1,  # type: ignore[call-overload]
                                    ids, str(req.get("stop") or "")))

    walk(trace["requests"], name, 0.0)  # type: ignore[arg-type]
    out.sort(key=lambda r: r.t)
    return out


def cap_gaps(requests: list[AgentRequest], max_gap: float) -> list[tuple[float, AgentRequest]]:
    """(capped time, request): every gap between consecutive requests shortened to at most ``max_gap``."""
    out: list[tuple[float, AgentRequest]] = []
    clock = prev = 0.0
    for i, r in enumerate(requests):
        if i:
            clock += min(r.t - prev, max_gap)
        prev = r.t
        out.append((clock, r))
    return out


class GroupIds:
    """Maps a request's 64-token ids onto 512-token trace-block ids, distinct across conversations."""

    def __init__(self) -> None:
        self._ids: dict[tuple[str, int, int], int] = {}

    def convert(self, conversation: str, source_ids: tuple[int, ...]) -> list[int]:
        out = []
        for start in range(0, len(source_ids), GROUP):
            group = source_ids[start : start + GROUP]
            key = (conversation, group[-1], len(group))
            out.append(self._ids.setdefault(key, len(self._ids)))
        return out


def build_slice(sources: list[Path], *, sessions: int, window: float, horizon: float, max_gap: float,
                max_context: int, seed: int) -> list[dict[str, object]]:
    """The slice's Mooncake lines, in time order (see the module docstring)."""
    rng = random.Random(seed)
    chosen = rng.sample(sorted(sources), min(sessions, len(sources)))
    timed: list[tuple[float, str, AgentRequest]] = []
    for path in chosen:
        trace = json.loads(path.read_text(encoding="utf-8"))
        start = rng.uniform(0.0, window)
        too_long: set[str] = set()
        for t, req in cap_gaps(flatten(trace), max_gap):
            if req.input_length > max_context:
                too_long.add(req.session)
            if req.session in too_long or start + t > horizon:
                continue
            timed.append((start + t, path.stem, req))
    timed.sort(key=lambda x: x[0])
    ids = GroupIds()
    return [{"timestamp": round(t * 1000.0, 3), "input_length": r.input_length, "output_length": r.output_length,
             "hash_ids": ids.convert(conversation, r.source_ids), "session": r.session, "stop": r.stop}
            for t, conversation, r in timed]


def write_jsonl(lines: Iterable[dict[str, object]], path: Path) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for line in lines:
            fh.write(json.dumps(line, separators=(",", ":")) + "\n")


def describe(lines: list[dict[str, object]]) -> dict[str, object]:
    """Requests, sessions, prompt sizes, stop reasons and ideal reuse of a slice."""
    seen: set[int] = set()
    hit = total = 0
    stops: dict[str, int] = {}
    for line in lines:
        for h in line["hash_ids"]:  # type: ignore[attr-defined]
            total += 1
            hit += h in seen
            seen.add(h)
        stops[str(line["stop"])] = stops.get(str(line["stop"]), 0) + 1
    prompts = sorted(int(line["input_length"]) for line in lines)  # type: ignore[call-overload]
    return {"requests": len(lines), "sessions": len({line["session"] for line in lines}),
            "subagent_requests": sum("/" in str(line["session"]) for line in lines),
            "median_prompt": prompts[len(prompts) // 2] if prompts else 0,
            "duration_s": (float(lines[-1]["timestamp"]) / 1000.0) if lines else 0.0,  # type: ignore[arg-type]
            "stops": stops, "ideal_reuse": round(hit / total, 4) if total else 0.0}


def active_context_tokens(lines: list[dict[str, object]], window: float, step: float = 10.0) -> float:
    """The concurrently active conversations' contexts, in tokens, averaged over the slice once every
    conversation has started (from ``window`` seconds on): a conversation is active from each request until its
    next one (its last: for a minute) with the context of that request (prompt plus output); sub-agents count
    in their parent's (they run inside its turn)."""
    by_conv: dict[str, list[tuple[float, int]]] = {}
    for line in lines:
        conv = str(line["session"]).split("/")[0]
        by_conv.setdefault(conv, []).append((float(line["timestamp"]) / 1000.0,  # type: ignore[arg-type]
                                             int(line["input_length"]) + int(line["output_length"])))  # type: ignore[call-overload]
    end = max((t for reqs in by_conv.values() for t, _ in reqs), default=0.0)
    ticks = [window + i * step for i in range(int(max(end - window, 0.0) // step) + 1)]
    totals = [0.0] * len(ticks)
    for reqs in by_conv.values():
        reqs.sort()
        for i, (t, context) in enumerate(reqs):
            until = reqs[i + 1][0] if i + 1 < len(reqs) else t + 60.0
            for k, tick in enumerate(ticks):
                if t <= tick < until:
                    totals[k] += context
    return sum(totals) / len(totals) if totals else 0.0


def trace_files(source: Path) -> list[Path]:
    """The kv-cache-tester trace files under ``source`` (or in its ``traces/``)."""
    found = sorted(source.glob("trace_*.json")) or sorted((source / "traces").glob("trace_*.json"))
    if not found:
        raise SystemExit(f"no trace_*.json under {source}")
    return found


def main(argv: Iterator[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--sessions", type=int, default=120)
    ap.add_argument("--window", type=float, default=1800.0)
    ap.add_argument("--horizon", type=float, default=3600.0)
    ap.add_argument("--max-gap", type=float, default=300.0)
    ap.add_argument("--max-context", type=int, default=128_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(list(argv) if argv is not None else None)
    lines = build_slice(trace_files(args.source), sessions=args.sessions, window=args.window,
                        horizon=args.horizon, max_gap=args.max_gap, max_context=args.max_context, seed=args.seed)
    write_jsonl(lines, args.out)
    print(json.dumps(describe(lines)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
