from __future__ import annotations

import pytest

from services.worker.mocker.timing import PrefillChunk, TimingModel


def test_prefill_monotonic_in_new_tokens() -> None:
    t = TimingModel()
    times = [t.prefill_ms(n) for n in (1, 10, 100, 1000, 10000)]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert t.prefill_ms(0) == 0.0


def test_prefill_superlinear_in_context() -> None:
    t = TimingModel()
    assert t.prefill_ms(1000, 32000) > t.prefill_ms(1000, 1000)
    assert t.prefill_ms(20000) > 2 * t.prefill_ms(10000) - t.prefill_ms_base


def test_cached_tokens_make_prefill_cheaper() -> None:
    t = TimingModel()
    prompt = 8000
    cold = t.step_seconds([PrefillChunk(prompt, prompt)], 0, 0)
    warm = t.step_seconds([PrefillChunk(prompt - 7000, prompt)], 0, 0)
    assert warm < cold / 4


def test_decode_grows_with_batch_and_kv() -> None:
    t = TimingModel()
    assert t.decode_ms(1, 10) < t.decode_ms(32, 10) < t.decode_ms(32, 10000)
    assert t.decode_ms(0, 100) == 0.0
    assert 0.010 <= t.step_seconds([], 1, 100) <= 0.025  # a realistic single-sequence step


def test_speedup_divides() -> None:
    slow, fast = TimingModel(), TimingModel(speedup=100)
    args = ([PrefillChunk(500, 1500)], 8, 400)
    assert fast.step_seconds(*args) == pytest.approx(slow.step_seconds(*args) / 100)


def test_mixed_step_pays_prefill_base_once() -> None:
    t = TimingModel()
    one = t.step_seconds([PrefillChunk(100, 100)], 0, 0)
    two = t.step_seconds([PrefillChunk(100, 100), PrefillChunk(100, 100)], 0, 0)
    assert two == pytest.approx(2 * one - t.prefill_ms_base / 1000)


def test_rejects_bad_coefficients() -> None:
    with pytest.raises(ValueError):
        TimingModel(speedup=0)
    with pytest.raises(ValueError):
        TimingModel(decode_ms_base=-1)
