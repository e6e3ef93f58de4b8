from __future__ import annotations

import pytest

from services.kvcore.timing import DynamoTiming, PrefillChunk, TimingModel


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


# -- --timing-model dynamo: Dynamo mocker's polynomials, shared with the trace-replay simulator ----------------


def test_dynamo_formulas() -> None:
    t = DynamoTiming(num_blocks=1000)
    assert t.prefill_ms(1000) == pytest.approx(4.209989e-7 * 1000**2 + 0.01518344 * 1000 + 16.50142)
    assert t.prefill_ms(8192) == pytest.approx(4.209989e-7 * 8192**2 + 0.01518344 * 8192 + 16.50142)
    assert t.prefill_ms(0) == 0.0
    assert t.decode_ms(0.0) == pytest.approx(5.74)
    assert t.decode_ms(0.5) == pytest.approx(-25.74 * 0.25 + 54.01 * 0.5 + 5.74)
    assert t.decode_ms(1.0) == pytest.approx(34.01)
    assert t.decode_ms(-1.0) == 1.0  # floored at 1 ms (the parabola goes negative outside [0, 1])


def test_dynamo_step_sums_prefill_tokens_and_decodes_once_at_utilisation() -> None:
    t = DynamoTiming(num_blocks=1000)
    chunks = [PrefillChunk(300, 5000), PrefillChunk(700, 700)]  # context is free: only new tokens count
    assert t.step_ms(chunks, 0, 0.9) == pytest.approx(t.prefill_ms(1000))
    assert t.step_ms(chunks, 12, 0.25) == pytest.approx(t.prefill_ms(1000) + t.decode_ms(0.25))
    assert t.step_ms([], 1, 0.25) == t.step_ms([], 64, 0.25) == pytest.approx(t.decode_ms(0.25))
    assert t.step_ms([], 0, 0.25) == 0.0
    # the live engine passes active blocks; utilisation is over num_blocks
    assert t.step_seconds(chunks, 3, 250) == pytest.approx(t.step_ms(chunks, 3, 0.25) / 1000)


def test_dynamo_speedup_divides_both() -> None:
    slow, fast = DynamoTiming(num_blocks=100), DynamoTiming(num_blocks=100, speedup=8)
    for args in (([PrefillChunk(4000, 4000)], 0, 10), ([], 5, 60), ([PrefillChunk(10, 10)], 5, 60)):
        assert fast.step_seconds(*args) == pytest.approx(slow.step_seconds(*args) / 8)
    with pytest.raises(ValueError):
        DynamoTiming(speedup=0)
    with pytest.raises(ValueError):
        DynamoTiming(num_blocks=0)
