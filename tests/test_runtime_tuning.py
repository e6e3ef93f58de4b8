"""What every service's entry point sets before its loop starts (``services/common/runtime.py``)."""

from __future__ import annotations

import gc
import sys

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
