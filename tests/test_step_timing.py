"""course_utils.step_timing: budgets, interleaved rounds and the noise rule (a difference inside
its band is never faster or slower)."""
import re
import statistics

import pytest

from course_utils.step_timing import (
    TOO_SMALL,
    TimeRatio,
    agreement,
    interleaved,
    steps_for_budget,
    time_ratio,
)


def ratio(r, spread=0.02, rounds=9, size="cpu", emulated=False):
    """A TimeRatio whose per-round ratios are r +- spread (reference 1 s)."""
    ts = [r + spread * ((i % 3) - 1) for i in range(rounds)]
    return time_ratio(ts, [1.0] * rounds, size=size, emulated=emulated)


def test_a_size_too_small_to_time_says_so_in_words_never_with_its_band():
    """Issue 27: course-profile printed "inconclusive at this size (1.47-1.54x)", a band far from
    1.00x, and the card then called the two step times "not told apart"."""
    times, reference = [1.47, 1.50, 1.54, 1.49, 1.52, 1.50], [1.0] * 6
    small = time_ratio(times, reference, size="smoke")
    assert small.verdict == TOO_SMALL == "too small to time" and small.low is not None
    for said in (small.describe(), small.band_text()):
        assert "steps of a few ms: timing not trusted at this size" in said
        assert "inconclusive" not in said and "1.4" not in said and "1.5" not in said
    assert small.describe() == ("step time: too small to time (steps of a few ms: timing not "
                                "trusted at this size)")
    # the same rounds at a size that can be timed: the ratio, its band and a verdict word
    assert time_ratio(times, reference, size="cpu").describe().startswith("step time 1.50x slower")


def test_time_ratio_is_within_noise_when_its_band_contains_one():
    assert ratio(1.30).verdict == "slower" and ratio(1.30).settled
    assert ratio(0.70).verdict == "faster"
    assert ratio(1.01, spread=0.05).verdict == "within noise"  # 1.01 +- 0.05 contains 1
    assert not ratio(1.01, spread=0.05).settled
    assert ratio(1.30, size="smoke").verdict == "too small to time"
    assert ratio(17.0, emulated=True).verdict == "emulated"
    assert time_ratio([], [1.0]).verdict == "not timed"
    one = time_ratio([1.1], [1.0], size="cpu")  # one round: no band
    assert one.verdict == "too few rounds" and one.low is None
    # no band, no verdict word, however far from 1 (issue 24; docs/method.md#verdict-words)
    assert time_ratio([3.0], [1.0], size="cpu").verdict == "too few rounds"
    assert time_ratio([3.0] * 2, [1.0] * 2, size="cpu").verdict == "too few rounds"
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


def test_the_band_holds_the_ratio_of_the_medians_a_table_prints():
    """A table beside the ratio prints each row's median step time (lesson 05 under load printed
    "1.22x slower" beside 1934 ms against 931 ms): whatever the rounds, the band reaches the
    ratio of the two medians, so the sentence and the table cannot disagree."""
    import random
    rng = random.Random(0)
    outside = 0
    for _ in range(300):
        n = rng.randint(5, 12)
        load = [rng.choice([1.0, 1.0, 2.5]) for _ in range(n)]  # a neighbour comes and goes
        ref = [rng.uniform(0.9, 1.1) * x for x in load]
        ts = [rng.uniform(1.1, 1.4) * x * rng.choice([1.0, 1.0, 2.0]) for x in load]
        r = time_ratio(ts, ref, size="cpu")
        of_medians = statistics.median(ts) / statistics.median(ref)
        assert r.low <= of_medians <= r.high
        q = statistics.quantiles([t / x for t, x in zip(ts, ref)], n=4, method="inclusive")
        outside += not q[0] <= of_medians <= q[2]
    assert outside > 10  # the cases the widening is for do occur


def test_budget_and_interleaving():
    assert steps_for_budget(0.1, 1.0) == 10
    assert steps_for_budget(10, 1.0) == 3 and steps_for_budget(1e-6, 1.0) == 50
    with pytest.raises(ValueError):
        steps_for_budget(0, 1.0)
    calls = []
    times = interleaved([lambda: calls.append("a"), lambda: calls.append("b")], rounds=4)
    # each round starts one step later: no step always runs first (a load that rises within
    # rounds would otherwise favour it)
    assert calls == ["a", "b", "b", "a"] * 2 and [len(t) for t in times] == [4, 4]
    order = []
    interleaved([lambda k=k: order.append(k) for k in "abc"], rounds=3)
    assert order == list("abcbcacab")
    times = interleaved([lambda: None], budget_s=0.01)
    assert 3 <= len(times[0]) <= 50
    with pytest.raises(ValueError):
        interleaved([lambda: None])  # neither a budget nor rounds
    with pytest.raises(ValueError):
        interleaved([lambda: None], 1.0, rounds=2)  # both


def test_agreement_says_whether_two_runs_of_the_same_pair_overlap_and_names_a_disagreement():
    """Lesson 02 timed full checkpointing 1.26x (1.24-1.30x), lesson 03 1.22x (1.21-1.22x) on
    one machine: the sentence must say they disagree, not leave the two numbers side by side."""
    lesson02 = TimeRatio(1.26, 1.24, 1.30, 17, "slower")
    assert "do not overlap" in agreement(TimeRatio(1.22, 1.21, 1.22, 9, "slower"), lesson02, "Lesson 02")
    said = agreement(TimeRatio(1.25, 1.20, 1.27, 9, "slower"), lesson02, "Lesson 02")
    assert "overlap: the two runs measured the same ratio" in said
    assert said.startswith("Lesson 02 timed the same pair")
    assert "1.26x slower" in said  # lesson 02's own sentence, as it printed it
    for unbanded in (TimeRatio(1.22, None, None, 2, "too few rounds"),
                     TimeRatio(1.22, 0.5, 3.0, 5, "too small to time"),
                     TimeRatio(30.0, 29.0, 31.0, 5, "emulated")):
        assert "not compared" in agreement(unbanded, lesson02, "Lesson 02")


def test_a_korean_kernel_describes_the_comparison_in_korean_with_the_same_numbers(monkeypatch):
    """Issue 28: the sentence is Korean and its numbers are the English one's; the verdict the
    code compares stays the English constant."""
    slow = ratio(1.30)
    english = slow.describe()
    monkeypatch.setenv("COURSE_LANG", "ko")
    korean = slow.describe()
    assert korean.startswith("스텝 시간 1.30x 더 느림 (노이즈 범위 ") and korean.endswith(", 9라운드)")
    assert re.findall(r"\d+\.\d+", korean) == re.findall(r"\d+\.\d+", english)
    assert slow.verdict == "slower"
    assert "1.43x 더 빠름" in ratio(0.70).describe()
    assert ratio(1.0, spread=0.1).describe().endswith(": 노이즈 범위 안")
    assert "시간 재기에는 너무 작음" in ratio(1.3, size="smoke").describe()
    assert not re.search(r"[a-z]{4,}", korean), korean  # no English word left


def test_a_pair_read_through_a_shared_reference_is_the_quotient_a_table_prints():
    """Issue 24: lesson 03 printed "1.29x slower" beside 672 and 798 ms (1.19), the table's
    times being each row's ratio to the first row. Read through that row, the pair's ratio is the
    quotient of the two ratios, and its band (from the pair's own rounds) reaches it."""
    import statistics
    first = [1.0, 1.6, 1.1, 1.9, 1.0, 1.7, 1.2, 1.8, 1.05, 1.5] * 2   # a load that changes
    a = [f * x for f, x in zip(first, [1.30, 1.45] * 10)]
    b = [f * x for f, x in zip(first, [1.10, 1.02] * 10)]
    table_a = statistics.median(x / f for x, f in zip(a, first))
    table_b = statistics.median(x / f for x, f in zip(b, first))
    r = time_ratio(a, b, size="cpu", through=first)
    assert r.ratio == pytest.approx(table_a / table_b)
    assert r.low <= r.ratio <= r.high and r.verdict == "slower"
    assert time_ratio(a, b, size="cpu").ratio != pytest.approx(r.ratio)  # the pair alone differs
