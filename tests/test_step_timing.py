"""course_utils.step_timing: budgets, interleaved rounds and the noise rule (a difference inside
its band is never faster or slower)."""
import pytest

from course_utils.step_timing import interleaved, steps_for_budget, time_ratio


def ratio(r, spread=0.02, rounds=9, size="cpu", emulated=False):
    """A TimeRatio whose per-round ratios are r +- spread (reference 1 s)."""
    ts = [r + spread * ((i % 3) - 1) for i in range(rounds)]
    return time_ratio(ts, [1.0] * rounds, size=size, emulated=emulated)


def test_time_ratio_is_within_noise_when_its_band_contains_one():
    assert ratio(1.30).verdict == "slower" and ratio(1.30).settled
    assert ratio(0.70).verdict == "faster"
    assert ratio(1.01, spread=0.05).verdict == "within noise"  # 1.01 +- 0.05 contains 1
    assert not ratio(1.01, spread=0.05).settled
    assert ratio(1.30, size="smoke").verdict == "inconclusive at this size"
    assert ratio(17.0, emulated=True).verdict == "emulated"
    assert time_ratio([], [1.0]).verdict == "not timed"
    one = time_ratio([1.1], [1.0], size="cpu")  # one round: no band
    assert one.verdict == "too few rounds" and one.low is None
    assert time_ratio([3.0], [1.0], size="cpu").verdict == "slower"  # beyond 2x even unpaired
    assert "within noise" in ratio(1.0, spread=0.1).describe()
    assert ratio(1.30, rounds=4).verdict == "too few rounds"  # fewer than MIN_ROUNDS


def test_the_rule_reads_the_band_as_printed():
    """A band whose printed bounds reach 1.00 is within noise, even when the raw bound does not
    (1.004 prints as 1.00): "1.03x (IQR 1.00-1.06x): slower" cannot happen."""
    r = time_ratio([1.004, 1.03, 1.06] * 3, [1.0] * 9,
                   size="cpu")
    assert r.low > 1 and f"{r.low:.2f}" == "1.00"
    assert r.verdict == "within noise" and "within noise" in r.describe()
    fast = ratio(0.70)
    assert fast.verdict == "faster" and "1.43x faster" in fast.describe()
    assert "0.70" not in fast.describe()


def test_the_band_covers_drift_between_blocks_of_rounds():
    """Rounds that drift (the machine warms up, a neighbour starts): the band covers the
    medians of the first and last third, not only the interquartile range of the whole."""
    ts = [1.20] * 4 + [1.25] * 4 + [1.30] * 4
    r = time_ratio(ts, [1.0] * 12, size="cpu")
    assert r.low == pytest.approx(1.20) and r.high == pytest.approx(1.30)


def test_paired_rounds_cancel_a_load_change_that_hits_both():
    """The machine slows down 3x half-way: per-round ratios stay put, the medians would not."""
    ref = [1.0] * 5 + [3.0] * 5
    ck = [1.3] * 5 + [3.9] * 5
    r = time_ratio(ck, ref, size="cpu")
    assert r.ratio == pytest.approx(1.3) and r.verdict == "slower"


def test_budget_and_interleaving():
    assert steps_for_budget(0.1, 1.0) == 10
    assert steps_for_budget(10, 1.0) == 3 and steps_for_budget(1e-6, 1.0) == 50
    with pytest.raises(ValueError):
        steps_for_budget(0, 1.0)
    calls = []
    times = interleaved([lambda: calls.append("a"), lambda: calls.append("b")], rounds=4)
    assert calls == ["a", "b"] * 4 and [len(t) for t in times] == [4, 4]
    times = interleaved([lambda: None], budget_s=0.01)
    assert 3 <= len(times[0]) <= 50
    with pytest.raises(ValueError):
        interleaved([lambda: None])  # neither a budget nor rounds
    with pytest.raises(ValueError):
        interleaved([lambda: None], 1.0, rounds=2)  # both
