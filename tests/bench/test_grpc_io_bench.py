"""``bench/grpc_io.py`` runs: both engines echo between two fresh processes (no timing is asserted)."""

from __future__ import annotations

import pytest

from bench.grpc_io import round_trip
from services.common.grpc_io import POLLER_IO


@pytest.mark.parametrize("experiments", ["", POLLER_IO])
def test_each_engine_echoes_between_two_processes(experiments: str) -> None:
    assert round_trip(experiments, messages=20) > 0
