"""A long-prompt, coding-agent-shaped trace in Mooncake's format (for ``harnessmesh replay`` and benches).

    python bench/long_trace.py --out long.jsonl [--sessions 32] [--turns 40] [--max-prompt 100000]
                               [--concurrency 16] [--system-tokens 12000] [--seed 0]

Writes one ``{"timestamp", "input_length", "output_length", "hash_ids"}`` line per request, sorted by
timestamp (see ``services/replay/trace.py``). Each hash id stands for one 512-token block and names its
whole prefix (Mooncake's convention): two requests share a prefix exactly as far as their ids agree.

Shape: ``--sessions`` agent sessions of ``--turns`` requests each. Every prompt starts with one system
prompt (tools and instructions, ``--system-tokens``) shared by all sessions; a session's next prompt is its
previous prompt + the model's output + a tool result, so its prompts grow turn by turn towards
``--max-prompt`` tokens (a turn that would pass it *compacts* the session, as coding agents do: the system
prompt + a summary, then it grows again). The next turn arrives when the previous one could have finished
(a modelled prefill + decode time) plus a tool's run time. Sessions start staggered so that about
``--concurrency`` run at once: with 4 workers of a few thousand 64-token blocks each, their contexts exceed
the KV cache and the engines preempt. The same arguments always give the same file.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

TRACE_BLOCK = 512  # tokens per hash id, Mooncake's convention (``services.replay.trace.TRACE_BLOCK``)

# a rough engine for the arrival times only (prefill tokens/s, decode s/token, tool run time mean s)
_PREFILL_TOK_S = 20_000.0
_DECODE_S = 0.02
_TOOL_S = 4.0


@dataclass
class _Session:
    """One agent session: its prompt as content segments ``(segment id, tokens)``."""

    segments: list[tuple[int, int]] = field(default_factory=list)

    @property
    def length(self) -> int:
        return sum(n for _, n in self.segments)


class _BlockIds:
    """Mooncake hash ids: block ``i``'s id is interned from (id of block ``i - 1``, what block ``i`` holds)."""

    def __init__(self) -> None:
        self._ids: dict[tuple[int, tuple[tuple[int, int, int], ...]], int] = {}

    def of(self, segments: list[tuple[int, int]]) -> list[int]:
        out: list[int] = []
        parent = -1
        content: list[tuple[int, int, int]] = []  # (segment, start, end) pieces of the current block
        filled = 0
        for seg, n in segments:
            pos = 0
            while pos < n:
                take = min(n - pos, TRACE_BLOCK - filled)
                content.append((seg, pos, pos + take))
                pos += take
                filled += take
                if filled == TRACE_BLOCK:
                    parent = self._intern(parent, content)
                    out.append(parent)
                    content, filled = [], 0
        if content:  # the partial last block: its own id (a longer prompt's block there differs)
            out.append(self._intern(parent, content))
        return out

    def _intern(self, parent: int, content: list[tuple[int, int, int]]) -> int:
        key = (parent, tuple(content))
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = len(self._ids)
        return found


def _lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, round(rng.lognormvariate(math.log(median), sigma))))


def generate(sessions: int, turns: int, max_prompt: int, concurrency: int, system_tokens: int,
             seed: int) -> list[dict[str, object]]:
    """The trace's lines (dicts), sorted by timestamp (ties: session order)."""
    if min(sessions, turns, max_prompt, concurrency) <= 0 or system_tokens < 0:
        raise ValueError("--sessions, --turns, --max-prompt and --concurrency must be positive")
    rng = random.Random(seed)
    ids = _BlockIds()
    next_segment = iter(range(1, 1 << 62))
    first_user = max(1, min(4000, max_prompt // 20))
    # each turn adds output + tool result; sized so a session reaches --max-prompt around its last turn
    growth = max(64.0, (max_prompt - system_tokens - first_user) / max(1, turns - 1))
    mean_turn_s = _TOOL_S + _DECODE_S * 300 + (max_prompt / 2) / _PREFILL_TOK_S
    start_gap_s = turns * mean_turn_s / concurrency
    lines: list[tuple[float, int, int, dict[str, object]]] = []
    for s in range(sessions):
        t = s * start_gap_s + rng.uniform(0, start_gap_s)
        sess = _Session([(0, system_tokens)] if system_tokens else [])
        sess.segments.append((next(next_segment), _lognormal(rng, first_user, 0.6, 50, 4 * first_user)))
        for turn in range(turns):
            if sess.length > max_prompt:
                summary = _lognormal(rng, first_user, 0.4, 200, 4 * first_user)
                sess.segments = [*sess.segments[:1 if system_tokens else 0], (next(next_segment), summary)]
            output = _lognormal(rng, 250, 0.9, 8, 4000)
            prompt = sess.length
            line = {"timestamp": round(t * 1000), "input_length": prompt, "output_length": output,
                    "hash_ids": ids.of(sess.segments)}
            lines.append((round(t * 1000), s, turn, line))
            tool = _lognormal(rng, max(16.0, (growth - 375) / 1.65), 1.0, 16, 4 * round(growth) + 1000)
            sess.segments += [(next(next_segment), output), (next(next_segment), tool)]
            t += prompt / _PREFILL_TOK_S + output * _DECODE_S + rng.expovariate(1 / _TOOL_S)
    lines.sort(key=lambda x: x[:3])
    return [line for *_, line in lines]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=32, help="agent sessions")
    ap.add_argument("--turns", type=int, default=40, help="requests per session")
    ap.add_argument("--max-prompt", type=int, default=100_000, help="prompt tokens a session grows to")
    ap.add_argument("--concurrency", type=int, default=16, help="sessions running at once (about)")
    ap.add_argument("--system-tokens", type=int, default=12_000, help="system prompt shared by every session")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="JSONL file to write")
    a = ap.parse_args()
    lines = generate(a.sessions, a.turns, a.max_prompt, a.concurrency, a.system_tokens, a.seed)
    with Path(a.out).open("w", encoding="utf-8") as fh:
        for line in lines:
            fh.write(json.dumps(line, separators=(", ", ": ")) + "\n")
    prompts = [int(str(x["input_length"])) for x in lines]
    print(f"{a.out}: {len(lines)} requests, prompt mean {sum(prompts) / len(prompts):,.0f} max {max(prompts):,} "
          f"tokens, {sum(prompts):,} prompt tokens")


if __name__ == "__main__":
    main()
