"""The noise rule (course_utils.timing) and the verdict engine (course_utils.claims): every rule
gets numbers that make its claim hold and numbers that make it fail, and no time verdict is
drawn inside the measured noise."""
import statistics

import pytest

from course_utils.claims import CLAIMS, STATUSES, Verdict, claims_table, verdict
from course_utils.hardware import HardwareInfo
from course_utils.timing import interleaved, steps_for_budget, time_ratio

A100 = HardwareInfo(device="cuda", name="A100", compute_capability=(8, 0), native_bf16=True,
                    fp16_fast=True)
T4 = HardwareInfo(device="cuda", name="Tesla T4", compute_capability=(7, 5), fp16_fast=True,
                  bf16_emulated=True)
H100 = HardwareInfo(device="cuda", name="H100", compute_capability=(9, 0), native_bf16=True,
                    fp16_fast=True)
CPU = HardwareInfo(device="cpu", name="AVX2 CPU", cpu_features={"avx2": True}, bf16_emulated=True)


def ratio(r, spread=0.02, rounds=9, size="cpu", emulated=False):
    """A TimeRatio whose per-round ratios are r +- spread (reference 1 s)."""
    ts = [r + spread * ((i % 3) - 1) for i in range(rounds)]
    return time_ratio(ts, [1.0] * rounds, size=size, emulated=emulated)


# --- the noise rule ---------------------------------------------------------------------

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


# --- one rule per claim: hold and fail --------------------------------------------------

CASES = {
    "C1": (dict(hw=A100, bf16_time=ratio(0.55)), dict(hw=A100, bf16_time=ratio(0.9))),
    "C2": (dict(peak_ratio=0.52), dict(peak_ratio=0.79, activations_ratio=0.56)),
    "C3": (dict(compile_time=ratio(0.6)), dict(compile_time=ratio(0.9))),
    "C4": (dict(peak_ratio=0.4, saved_ratio=0.1), dict(peak_ratio=0.9, saved_ratio=0.8)),
    "C5": (dict(full_time=ratio(1.25), flops_ratio=1.22), dict(full_time=ratio(1.75))),
    "C6": (dict(plain_growth=4.0, sqrt_growth=2.0, best_segments=4, sqrt_segments=4),
           dict(plain_growth=4.0, sqrt_growth=3.9, best_segments=16, sqrt_segments=4)),
    "C7": (dict(full_time=ratio(0.8)), dict(full_time=ratio(1.3))),
    "C8": (dict(kept_bytes=10, expected_bytes=12), dict(kept_bytes=10, expected_bytes=10)),
    "C9": (dict(bytes_per_param=16.0, overheads={"a": 0.25}),
           dict(bytes_per_param=18.0, overheads={"a": 0.25})),
    "C10": (dict(n_params=7e9), dict(n_params=7e9)),  # see test_c10_is_derived
    "C11": (dict(flushed_unscaled=0.05, flushed_scaled=0.0, scale=65536.0),
            dict(flushed_unscaled=0.05, flushed_scaled=0.04, scale=65536.0)),
    "C12": (dict(backoffs_ok=[True, True], growth_after=[5, 5], growth_interval=5),
            dict(backoffs_ok=[True, False], growth_after=[5], growth_interval=5)),
    "C13": (dict(same_range=True, flushed_bf16=0.0, val_loss_gap=0.004),
            dict(same_range=True, flushed_bf16=0.0, val_loss_gap=0.08)),
    "C14": (dict(reentrant_lost_grads=True, reentrant_failures=("kwargs", "autograd.grad")),
            dict(reentrant_lost_grads=False, reentrant_failures=())),
    "C15": (dict(naive_extra_slope=2.0, sdpa_slope=2.0), dict(naive_extra_slope=1.0,
                                                              sdpa_slope=1.0)),
    "C16": (dict(hw=A100, bf16_vs_fp16=1.0), dict(hw=T4, bf16_vs_fp16=1.0)),
    "C17": (dict(grad_rel_err=1e-7, undivided_ratio=4.0, k=4, extra_peak_bytes=0,
                 grad_buffer_bytes=100, peak_vs_big=0.3),
            dict(grad_rel_err=1e-7, undivided_ratio=4.0, k=4, extra_peak_bytes=500,
                 grad_buffer_bytes=100, peak_vs_big=1.1)),
    "C18": (dict(clip_saw_ratio=65536.0, scale=65536.0, sgd_update_ratio=1.5e-5,
                 adamw_update_ratio=0.5), dict(clip_saw_ratio=1.0, scale=65536.0)),
    "C19": (dict(hw=H100, fp8_time=ratio(0.6)), dict(hw=H100, fp8_time=ratio(1.1))),
    "C20": (dict(per_token_time=ratio(0.8)), dict(per_token_time=ratio(1.3))),
}


@pytest.mark.parametrize("claim", [c for c in CLAIMS if c not in ("C7", "C8", "C10")])
def test_each_rule_holds_and_fails(claim):
    held, busted = CASES[claim]
    v = verdict(claim, where="test", **held)
    assert isinstance(v, Verdict) and v.status == "held", v
    assert v.evidence and any(ch.isdigit() for ch in v.evidence), "evidence carries numbers"
    assert verdict(claim, **busted).status == "busted", verdict(claim, **busted)


def test_c1_depends_on_the_baseline_when_tf32_closes_the_gap():
    """An H100 printed bf16 8.34x faster than full fp32 and a bf16 matmul only 1.34x faster than
    a TF32 one: by the lesson's own framing that is "depends" (on the baseline), not "held"."""
    fast = ratio(0.12, spread=0.001)
    v = verdict("C1", hw=H100, bf16_time=fast, bf16_vs_tf32=0.039 / 0.053)
    assert v.status == "depends" and "TF32" in v.evidence and "0.74x" in v.evidence
    assert "one probe each" in v.evidence and v.evidence.count("faster") == 1  # said once
    assert verdict("C1", hw=H100, bf16_time=fast, bf16_vs_tf32=0.4).status == "held"
    assert verdict("C1", hw=H100, bf16_time=fast).status == "held"  # no TF32 probe: full fp32 only
    assert verdict("C1", hw=H100, bf16_time=ratio(0.9), bf16_vs_tf32=0.4).status == "busted"


def test_c11_c13_name_the_gradients_they_count_and_print_no_signed_zero():
    v = verdict("C11", flushed_unscaled=0.01332, flushed_scaled=0.00026, scale=65536.0,
                which="activation gradients")
    assert "1.332% of the activation gradients unscaled" in v.evidence
    v = verdict("C13", same_range=True, flushed_bf16=0.0, val_loss_gap=-2e-7,
                which="activation gradients")
    assert "of the activation gradients" in v.evidence and "-0.00%" not in v.evidence
    assert "within 0.01% of fp32's validation loss" in v.evidence
    assert "ended +0.82% from" in verdict("C13", same_range=True, flushed_bf16=0.0,
                                          val_loss_gap=0.0082).evidence


def test_c5_prints_the_published_range_exercise_02_and_lesson_02_cite():
    v = verdict("C5", full_time=ratio(1.25))
    assert "published: 20-40%" in v.evidence and "held from +15% to +40%" in v.evidence


def test_c7_never_holds_on_a_step_that_recomputes():
    """A checkpointed step is the plain step plus a recomputed forward: "faster" per step means
    the load changed while it was timed (lesson 03 printed "1.75x faster" on a busy laptop), so
    it is inconclusive, never held; slower per step is busted, or depends through the batch."""
    fast = verdict("C7", full_time=ratio(0.6))
    assert fast.status == "inconclusive" and "run it again" in fast.evidence
    assert verdict("C7", full_time=ratio(1.3)).status == "busted"
    assert verdict("C7", full_time=ratio(1.3), per_token_time=ratio(0.8)).status == "depends"


def test_c8_is_busted_when_only_block_inputs_are_kept():
    assert verdict("C8", kept_bytes=10, expected_bytes=10).status == "busted"
    assert verdict("C8", batch_ratio=2.0).status == "busted"
    assert verdict("C8", kept_bytes=10, expected_bytes=12).status == "inconclusive"
    with pytest.raises(ValueError):
        verdict("C8")


def test_c10_is_derived_and_depends_on_its_two_parts():
    """28 GB of fp32 weights is right, 84 GB of Adam states is not (56 GB): true for part of the
    claim is "depends", as lesson 03 §9 defines it; wrong on both parts is "busted"."""
    v = verdict("C10", n_params=7e9)
    assert v.status == "depends" and v.basis == "derived"
    assert "28 GB: right" in v.evidence and "56 GB, not 84 GB" in v.evidence
    assert v.evidence.startswith("7B parameters") and "e+09" not in v.evidence
    assert verdict("C10", n_params=1e9).status == "busted"
    assert verdict("C10", n_params=7e9 * 84 / 56 * 56 / 84).basis == "derived"


def test_evidence_prints_readable_numbers():
    """Byte counts in KiB/MiB, large factors with thousands separators, tiny ones as 1/N."""
    v = verdict("C8", kept_bytes=4203520, expected_bytes=4203520, param_bytes=13293568)
    assert v.evidence == "kept 4.01 MiB = the block inputs and token ids; parameters 12.7 MiB, not copied"
    v = verdict("C8", kept_bytes=4203520, expected_bytes=4203000)
    assert v.status == "inconclusive" and "+520 bytes" in v.evidence
    v = verdict("C18", clip_saw_ratio=65536.2, scale=65536.0, sgd_update_ratio=1.3e-5)
    assert "65,536x the true norm (scale 65,536)" in v.evidence
    assert "1/77,000 of the right one" in v.evidence and "e-05" not in v.evidence
    v = verdict("C13", same_range=True, flushed_bf16=0.0, val_loss_gap=-2e-5)
    assert "within 0.01% of fp32's" in v.evidence and "-0.00%" not in v.evidence
    assert "+0.40% from" in verdict("C13", same_range=True, flushed_bf16=0.0,
                                    val_loss_gap=0.004).evidence


def test_time_claims_are_never_decided_inside_the_noise():
    for claim, key in (("C1", "bf16_time"), ("C3", "compile_time"), ("C5", "full_time"),
                       ("C7", "full_time"), ("C19", "fp8_time"), ("C20", "per_token_time")):
        held = dict(CASES[claim][0])
        held[key] = ratio(1.0, spread=0.1)
        assert verdict(claim, **held).status == "inconclusive", claim
        held[key] = ratio(1.3, size="smoke")
        assert verdict(claim, **held).status == "inconclusive", claim


def test_c5_is_inconclusive_when_its_band_straddles_an_edge_of_the_held_range():
    # lesson 02 on a bf16 CPU: "busted ... 1.14x slower (noise band 1.12-1.21x)": the band
    # reaches into the held range, so the run cannot tell held from busted
    straddles = time_ratio([1.12, 1.14, 1.21, 1.13, 1.15, 1.20], [1.0] * 6, size="cpu")
    assert straddles.verdict == "slower" and straddles.low < 1.15 < straddles.high
    v = verdict("C5", full_time=straddles, flops_ratio=1.22)
    assert v.status == "inconclusive" and "straddles the +15% edge of the held range" in v.evidence
    wide = verdict("C5", full_time=ratio(1.27, spread=0.2))
    assert wide.status == "inconclusive" and "+15% and +40% edges" in wide.evidence
    assert verdict("C5", full_time=ratio(1.40, spread=0.03)).status == "inconclusive"
    # wholly inside: held; wholly outside on either side: busted
    assert verdict("C5", full_time=ratio(1.25)).status == "held"
    assert verdict("C5", full_time=ratio(1.08)).status == "busted"
    assert verdict("C5", full_time=ratio(1.60)).status == "busted"
    # the band as printed decides: 1.1496 prints as 1.15, inside the range
    edge = time_ratio([1.1496, 1.16, 1.17] * 3, [1.0] * 9, size="cpu")
    assert round(edge.low, 2) == 1.15 and verdict("C5", full_time=edge).status == "held"


def test_hardware_claims_say_why_not_measured_here():
    v = verdict("C1", hw=CPU, bf16_time=ratio(3.4, emulated=True))
    assert v.status == "not measured here" and "Ampere" in v.evidence and "3.40x" in v.evidence
    assert verdict("C16", hw=CPU, recipe="fp32").status == "not measured here"
    assert verdict("C16", hw=A100).status == "not measured here"  # on CUDA, but not timed
    v = verdict("C19", hw=CPU, why_not="no FP8 tensor cores: this is a CPU")
    assert v.status == "not measured here" and "FP8" in v.evidence and v.basis == "none"
    with pytest.raises(ValueError, match="why not"):
        verdict("C19", hw=CPU)
    with pytest.raises(ValueError, match="why not"):
        verdict("C3")


def test_depends_where_the_numbers_show_it():
    assert verdict("C4", peak_ratio=0.64, saved_ratio=0.1).status == "depends"
    assert verdict("C7", full_time=ratio(1.3), per_token_time=ratio(0.8)).status == "depends"
    assert verdict("C15", naive_extra_slope=2.0, sdpa_slope=1.0).status == "depends"
    assert verdict("C11", flushed_unscaled=0.0, flushed_scaled=0.0, scale=1.0).status == "depends"


def test_c17_is_not_held_when_the_peak_rises_above_one_micro_batch():
    """+9.14 MiB above one micro-batch is not "no extra memory": the .grad buffer makes it
    "depends" (the division is right, the memory is not free)."""
    mib = 2**20
    v = verdict("C17", grad_rel_err=1e-7, undivided_ratio=4.0, k=4,
                extra_peak_bytes=int(9.14 * mib), grad_buffer_bytes=int(9.1 * mib),
                peak_vs_big=0.4)
    assert v.status == "depends" and "+9.14 MiB" in v.evidence and ".grad buffer" in v.evidence


def test_engine_errors_and_table():
    with pytest.raises(ValueError, match="unknown claim"):
        verdict("C99")
    with pytest.raises(TypeError):
        verdict("C2", peak=0.5)  # an input the rule does not take
    with pytest.raises(ValueError):
        Verdict("C2", "untested", "x")
    table = claims_table([verdict("C2", peak_ratio=0.9), verdict("C1", hw=CPU),
                          verdict("C2", peak_ratio=0.5)])
    assert list(table.index) == ["C1", "C2"] and table.loc["C2", "status"] == "held"
    assert set(table["status"]) <= set(STATUSES)


def test_an_unpaired_time_is_set_against_the_reference_median():
    """One emulated step against nine reference rounds: the ratio is to the median, not to the
    first round (which may be a slow calibration round)."""
    r = time_ratio([11.4], [1.77, 0.84, 0.84, 0.83, 0.85, 0.84, 0.84, 0.86, 0.84], size="cpu",
                   emulated=True)
    assert r.ratio == pytest.approx(11.4 / 0.84) and r.rounds == 1 and r.verdict == "emulated"
