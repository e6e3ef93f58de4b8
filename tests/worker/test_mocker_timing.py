"""The worker's --timing-model options pick the mocker's step-time model, the simulator's own."""

from __future__ import annotations

import pytest

from services.common.model_dir import load_model_dir
from services.kvcore.timing import DynamoTiming, TimingModel
from services.worker.mocker import MockerEngine
from services.worker.registry import build_engine
from services.worker.settings import WorkerSettings


def test_timing_model_option_selects_the_engine_model() -> None:
    settings = WorkerSettings(timing_model="dynamo", num_blocks=512, speedup=4.0)
    engine = build_engine(settings, load_model_dir(""))
    assert isinstance(engine, MockerEngine)
    assert engine.config.timing == DynamoTiming(num_blocks=512, speedup=4.0)
    engine = build_engine(WorkerSettings(decode_ms_base=7.0), load_model_dir(""))
    assert isinstance(engine, MockerEngine) and isinstance(engine.config.timing, TimingModel)
    assert engine.config.timing.decode_ms_base == 7.0
    with pytest.raises(ValueError, match="timing model"):
        WorkerSettings(timing_model="vllm").validate()


def test_simulator_and_mocker_share_one_timing_implementation() -> None:
    from services.replay import sim_worker as worker
    from services.replay import simulator as replay

    assert replay.DynamoTiming is worker.DynamoTiming is DynamoTiming
