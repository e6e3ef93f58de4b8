"""Pure helpers of ``bench/vs_dynamo.py``: the /proc CPU reader and the workload builders (no processes)."""

from __future__ import annotations

import itertools
import os

from bench.dynamo_peer.procstat import cpu_between, descendants, parse_stat, tree_ticks
from bench.dynamo_peer.workload import fallback_long_trace, short_prompt, tool_loop_session

TICK = os.sysconf("SC_CLK_TCK")


def test_parse_stat_survives_odd_command_names() -> None:
    # fields after the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    line = "4242 (a) b (c) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0 999"
    assert parse_stat(line) == (17, 325)


def test_descendants_walks_the_whole_tree_and_only_it() -> None:
    stats = {1: (0, 0), 10: (1, 0), 11: (10, 0), 12: (11, 0), 20: (1, 0), 21: (20, 0)}
    assert descendants(stats, [10]) == {10, 11, 12}
    assert descendants(stats, [10, 20]) == {10, 11, 12, 20, 21}
    assert descendants(stats, [99]) == set()


def test_cpu_between_counts_new_processes_from_zero() -> None:
    assert cpu_between({1: 100, 2: 50}, {1: 100 + TICK, 2: 50, 3: TICK}) == 2.0


def test_tree_ticks_sees_this_process() -> None:
    assert os.getpid() in tree_ticks([os.getpid()])


def test_short_prompts_are_unique_and_about_150_words() -> None:
    a, b = short_prompt(), short_prompt()
    assert a != b and 150 <= len(a.split()) <= 155


def test_next_turn_extends_the_history_by_one_call_and_its_result() -> None:
    turn1, next_turn = tool_loop_session(20_000, tokens_per_word=2.0, seed=1)
    assert next_turn[: len(turn1)] == turn1
    assert [m["role"] for m in next_turn[len(turn1):]] == ["assistant", "tool"]
    words = sum(len(str(m.get("content") or "").split()) for m in turn1)
    assert 8_000 <= words <= 11_000  # ~20k tokens at 2 tokens/word
    assert tool_loop_session(20_000, 2.0, seed=1) == (turn1, next_turn)
    assert tool_loop_session(20_000, 2.0, seed=2)[0][0] != turn1[0]  # each session its own prefix


def test_fallback_trace_grows_prompts_by_extending_their_prefix() -> None:
    lines = fallback_long_trace(sessions=3, turns=5, max_prompt=10_000)
    assert len(lines) == 15
    assert [x["timestamp"] for x in lines] == sorted(x["timestamp"] for x in lines)
    assert max(x["input_length"] for x in lines) == 10_000
    by_first: dict[int, list[list[int]]] = {}
    for x in lines:
        assert len(x["hash_ids"]) * 512 >= x["input_length"]
        by_first.setdefault(x["hash_ids"][0], []).append(x["hash_ids"])
    for ids in by_first.values():
        for shorter, longer in itertools.pairwise(ids):
            assert longer[: len(shorter)] == shorter
