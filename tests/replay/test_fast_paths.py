"""The simulator's fast paths give exactly what the step-by-step, token-list, block-by-block paths give.

Fast paths: runs of decode steps as one event (``EngineCore.decode_stretch``, ``EngineCore.quiet_steps`` /
``advance_quiet``, ``EngineCore.plain_step``, ``SimWorker.start_step``),
bulk sealing of uncached known blocks (``BlockManager._fill_new``), lazily held trace prompts
(``PromptTokens``, ``TokenStream``, ``TokenWindow``) and batched token draws (``TokenSource.take``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import astuple
from pathlib import Path
from typing import Any

import pytest

from bench.long_trace import generate
from services.kvcore import domain as eng
from services.kvcore.block_manager import BlockManager, KvSequence
from services.kvcore.core import EngineCore
from services.kvcore.request import TokenStream
from services.kvcore.tokens import FillerText, FillerVocabulary, TokenSource
from services.replay.sim_worker import SimWorkerConfig
from services.replay.simulator import Replay, ReplayConfig
from services.replay.trace import TracePrompts, TraceRequest, load_trace


class _Recording(Replay):
    """A replay that keeps every KV event each worker emits, in order."""

    def __init__(self, config: ReplayConfig) -> None:
        super().__init__(config)
        self.events: dict[str, list[eng.KvEvent]] = {wid: [] for wid in self.workers}

    def _on_events(self, worker_id: str, events: list[eng.KvEvent]) -> None:
        self.events[worker_id].extend(events)
        super()._on_events(worker_id, events)


def _trace(tmp_path: Path) -> list[TraceRequest]:
    lines = generate(sessions=8, turns=10, max_prompt=20_000, concurrency=6, system_tokens=3000, seed=1)
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return load_trace(path)


def _run(trace: list[TraceRequest], mode: str) -> dict[str, Any]:
    # arrivals 4x faster than the trace's, on caches that hold about one prompt: both workers preempt
    config = ReplayConfig(workers=2, mode=mode, worker=SimWorkerConfig(block_size=64, num_blocks=360), speedup=4.0)
    sim = _Recording(config)
    result = sim.run(trace)
    return {
        "result": result,
        "records": [astuple(r) for r in sim.records],
        "events": sim.events,
        "workers": {wid: (w.scheduler.preemptions, w.core.steps) for wid, w in sim.workers.items()},
        "end": sim.now,
    }


@pytest.mark.parametrize("mode", ["kv", "round-robin"])
def test_fast_paths_replay_exactly_like_the_step_by_step_loop(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = _trace(tmp_path)
    fast = _run(trace, mode)
    with monkeypatch.context() as m:
        m.setattr(EngineCore, "decode_stretch", lambda self, step_ms, start, *args, **kwargs: (0, start, None))
        m.setattr(EngineCore, "quiet_steps", lambda self: 0)
        m.setattr(EngineCore, "plain_step", lambda self: None)
        m.setattr(BlockManager, "_fill_new", lambda self, *args: False)
        slow = _run(trace, mode)
    assert all(p > 0 for p, _ in fast["workers"].values()), "the trace must make every engine preempt"
    assert fast == slow


def test_bulk_sealing_matches_block_by_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """Random appends and frees (shared prefixes, twins, evictions) leave equal managers and event streams."""

    def play(bulk: bool) -> tuple[list[eng.KvEvent], list[int], int, list[list[int]]]:
        rng = random.Random(7)
        events: list[eng.KvEvent] = []
        bm = BlockManager(48, 4, events.append)
        if not bulk:
            monkeypatch.setattr(bm, "_fill_new", lambda *args: False)
        streams = [[rng.randrange(3) for _ in range(200)] for _ in range(4)]
        seqs = [KvSequence() for _ in streams]
        for _ in range(300):
            i = rng.randrange(len(seqs))
            seq, stream = seqs[i], streams[i]
            if rng.random() < 0.2 or seq.length >= len(stream):
                bm.free(seq)
                if rng.random() < 0.5:
                    bm.acquire_prefix(seq, stream[: rng.randrange(1, len(stream))])
                continue
            n = rng.choice([1, 2, 5, 13, 40])
            bm.append(seq, stream[seq.length : seq.length + n])
        return events, bm.lru_order(), bm.free_blocks, [s.hashes for s in seqs]

    assert play(bulk=True) == play(bulk=False)


def test_prompt_tokens_and_token_streams_index_and_slice_like_lists() -> None:
    rng = random.Random(3)
    for block_size in (16, 64, 100):
        cache = TracePrompts(block_size, max_blocks=8, max_prompts=4)
        for _ in range(60):
            ids = tuple(rng.randrange(40) for _ in range(rng.randrange(0, 8)))
            req = TraceRequest(0, rng.randrange(1, 8 * 512 + 300), 1, ids)
            prompt, _ = cache.prompt(req)
            ref = req.tokens()
            stream = TokenStream(prompt)
            generated = [rng.randrange(100) for _ in range(rng.randrange(0, 50))]
            stream.extend(generated[:3])
            for token in generated[3:]:
                stream.append(token)
            full = ref + generated
            assert list(prompt) == ref and list(stream) == full and len(stream) == len(full)
            for _ in range(30):
                a, b = rng.randrange(-len(full) - 5, len(full) + 5), rng.randrange(-len(full) - 5, len(full) + 5)
                assert prompt[a:b] == ref[a:b] and prompt[a:] == ref[a:] and prompt[:b] == ref[:b]
                assert stream[a:b] == full[a:b] and stream[a:b:3] == full[a:b:3]
                if -len(ref) <= a < len(ref):
                    assert prompt[a] == ref[a]
                if -len(full) <= a < len(full):
                    assert stream[a] == full[a]
                lo, hi = sorted((abs(a) % (len(full) + 1), abs(b) % (len(full) + 1)))
                for then in (None, 77):
                    window, seen = stream.window(lo, hi, then), full[lo:hi] + ([] if then is None else [then])
                    assert len(window) == len(seen) and list(window) == seen and window[a:b] == seen[a:b]


def _twin_sources(vocab: FillerVocabulary, rng: random.Random, count: int) -> Iterator[tuple[TokenSource, TokenSource]]:
    """``count`` pairs of equal token sources (a random script, with or without EOS, a random filler seed)."""
    for _ in range(count):
        scripted = [rng.randrange(1000) for _ in range(rng.randrange(0, 6))]
        eos, seed = rng.choice([None, 7]), rng.randrange(10**6)
        yield TokenSource(scripted, eos, FillerText(vocab, seed)), TokenSource(scripted, eos, FillerText(vocab, seed))


def test_taking_tokens_in_bulk_draws_what_popping_them_does(vocab: FillerVocabulary) -> None:
    rng = random.Random(5)
    for bulk, single in _twin_sources(vocab, rng, 100):
        for _ in range(20):
            if rng.random() < 0.3:
                assert bulk.peek() == single.peek()
            n = rng.randrange(0, 40)
            assert bulk.take(n) == [single.pop() for _ in range(n)]


@pytest.fixture
def vocab() -> FillerVocabulary:
    from services.common.model_dir import load_model_dir

    return FillerVocabulary(load_model_dir("").tokenizer)


def test_known_tokens_are_what_taking_them_gives_and_leave_the_draws_unchanged(vocab: FillerVocabulary) -> None:
    """``TokenSource.known`` (the live step loop's look past a request's next token, for stop ids) draws ahead
    without consuming: any mix of peeks, pops, takes and looks yields the sequence a source never looked at does."""
    rng = random.Random(11)
    for looked, plain in _twin_sources(vocab, rng, 100):
        for _ in range(30):
            op, n = rng.randrange(4), rng.randrange(0, 20)
            if op == 0:
                ahead = looked.known(n)
                assert len(ahead) == n and looked.known(n) == ahead  # looking again changes nothing
                k = rng.randrange(0, n + 1)
                assert looked.take(k) == plain.take(k) == ahead[:k]  # what was looked at comes next
            elif op == 1:
                assert looked.peek() == plain.peek()
            elif op == 2:
                assert looked.pop() == plain.pop()
            else:
                assert looked.take(n) == plain.take(n)
        assert looked.take(50) == plain.take(50)
