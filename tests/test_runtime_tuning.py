"""What every service's entry point sets before its loop starts (``services/common/runtime.py``)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest

from services.common import runtime


def test_the_collector_and_the_gil_are_tuned_for_the_event_loop() -> None:
    thresholds, interval = gc.get_threshold(), sys.getswitchinterval()
    try:
        runtime._tune_gc()
        assert gc.get_threshold() == runtime.GC_THRESHOLDS
        assert sys.getswitchinterval() == runtime.SWITCH_INTERVAL < 0.005  # below Python's default
        assert gc.get_freeze_count() > 0  # what start-up imported is out of the collector's sight
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        sys.setswitchinterval(interval)


# A session's turns as a process sees them: a prompt a little longer each turn, and a transient copy of it.
_TURNS = """
import resource, sys
from services.common import runtime
tuned = runtime.tune_malloc({}) if sys.argv[1] == "tuned" else False
prompt = bytes(400_000)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for turn in range(200):
    prompt = prompt + bytes(1000)
    copy = bytes(len(prompt))
print(tuned, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 200)
"""


def _faults_per_turn(mode: str) -> tuple[str, float]:
    out = subprocess.run([sys.executable, "-c", _TURNS, mode], capture_output=True, text=True, timeout=60,
                         check=True, env={k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")
                                          and k != "GLIBC_TUNABLES"})
    tuned, faults = out.stdout.split()
    return tuned, float(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")
def test_tuned_malloc_reuses_the_last_turns_pages() -> None:
    untuned, tuned = _faults_per_turn("default"), _faults_per_turn("tuned")
    if tuned[0] != "True":
        pytest.skip("not glibc: malloc is left as it is")
    assert tuned[1] * 4 < untuned[1], (tuned, untuned)  # here ~3 against ~129 faults a turn


def test_the_operators_own_malloc_settings_are_kept() -> None:
    assert runtime.tune_malloc({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}) is False
    assert runtime.tune_malloc({"MALLOC_TRIM_THRESHOLD_": "0"}) is False
