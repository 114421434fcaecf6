"""The verdict engine (course_utils.claims): every rule gets numbers that make its claim hold and
numbers that make it fail, no time verdict is drawn inside the measured noise, and the ledger
shows the verdict a lesson recorded on this machine (the results store), measuring again only
what no lesson recorded."""
import dataclasses

import pytest

from course_utils import claims, store
from course_utils.claims import CLAIMS, STATUSES, Verdict, claims_table, verdict
from course_utils.hardware import HardwareInfo, detect
from course_utils.step_timing import time_ratio

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


@pytest.mark.parametrize("claim", [c for c in CLAIMS if c not in ("C7", "C8", "C10", "C20")])
def test_each_rule_holds_and_fails(claim):
    held, busted = CASES[claim]
    v = verdict(claim, where="test", **held)
    assert isinstance(v, Verdict) and v.status == "held", v
    assert v.evidence and any(ch.isdigit() for ch in v.evidence), "evidence carries numbers"
    assert verdict(claim, **busted).status == "busted", verdict(claim, **busted)


def test_c20_says_can_so_one_slower_machine_does_not_bust_it():
    held, slower = CASES["C20"]
    assert verdict("C20", **held).status == "held"
    v = verdict("C20", **slower)
    assert v.status == "depends" and "slower" in v.evidence


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
    assert "within +20% to +40%" in v.evidence and "20-40%" not in v.evidence  # one range said


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
    # a band from below the held range into it: the run cannot tell held from busted
    straddles = time_ratio([1.14, 1.17, 1.24, 1.16, 1.18, 1.23], [1.0] * 6, size="cpu")
    assert straddles.verdict == "slower" and straddles.low < 1.20 < straddles.high
    v = verdict("C5", full_time=straddles, flops_ratio=1.22)
    assert v.status == "inconclusive" and "straddles the +20% edge of the held range" in v.evidence
    wide = verdict("C5", full_time=ratio(1.27, spread=0.2))
    assert wide.status == "inconclusive" and "+20% and +40% edges" in wide.evidence
    assert verdict("C5", full_time=ratio(1.40, spread=0.03)).status == "inconclusive"
    # wholly inside: held; wholly outside on either side: busted
    assert verdict("C5", full_time=ratio(1.25)).status == "held"
    assert verdict("C5", full_time=ratio(1.08)).status == "busted"
    assert verdict("C5", full_time=ratio(1.60)).status == "busted"
    # the band as printed decides: 1.1996 prints as 1.20, inside the range
    edge = time_ratio([1.1996, 1.21, 1.22] * 3, [1.0] * 9, size="cpu")
    assert round(edge.low, 2) == 1.20 and verdict("C5", full_time=edge).status == "held"


def test_hardware_claims_say_why_not_measured_here():
    v = verdict("C1", hw=CPU, bf16_time=ratio(3.4, emulated=True))
    assert v.status == "not measured here" and "Ampere" in v.evidence and "3.4" not in v.evidence
    assert verdict("C16", hw=CPU, recipe="fp32").status == "not measured here"
    assert verdict("C16", hw=A100).status == "not measured here"  # on CUDA, but not timed
    # a T4 stand-in on an H200 timed bf16 at 0.14x fp16's and was "busted": the H200's speed
    stand = dataclasses.replace(T4, stand_in="NVIDIA H200 standing in for a Tesla T4")
    v = verdict("C16", hw=stand, bf16_vs_fp16=0.14)
    assert v.status == "not measured here" and "H200" in v.evidence
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


def check_same_verdict(lesson: claims.Verdict, ledger: claims.Verdict) -> None:
    assert (lesson.claim, lesson.status, lesson.evidence) == (ledger.claim, ledger.status,
                                                              ledger.evidence), (lesson, ledger)


@pytest.fixture
def results_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path))
    return tmp_path


C11_LESSON = dict(flushed_unscaled=0.01331, flushed_scaled=0.0, scale=65536.0, which="activation gradients")


C11_TINY = dict(flushed_unscaled=0.00113, flushed_scaled=0.0, scale=65536.0)


def test_the_ledger_shows_the_verdict_the_lesson_recorded(results_dir):
    lesson = claims.verdict("C11", where="01 §3", record=True, **C11_LESSON)  # as lesson 01 runs it
    assert store.store_path().is_file()
    ledger = claims.recorded_or_measure("C11", "[01](01_amp_review.ipynb)", lambda: C11_TINY,
                                        model="a 2-block model")
    check_same_verdict(lesson, ledger)
    assert ledger.where == "[01](01_amp_review.ipynb)"
    # the broken telling: a ledger that measures again on a tiny model prints other numbers
    remeasured = claims.verdict("C11", where="03", **C11_TINY)
    with pytest.raises(AssertionError):
        check_same_verdict(lesson, remeasured)


def test_only_what_no_lesson_recorded_is_measured_again_and_labelled(results_dir):
    v = claims.recorded_or_measure("C11", "L01", lambda: C11_TINY, model="a 2-block model")
    assert "measured again here on a 2-block model" in v.where
    assert claims.recorded_verdict("C11") is None  # the ledger's own measurement is not recorded


def test_a_verdict_is_recorded_only_for_this_machine_torch_and_size(results_dir):
    claims.verdict("C11", where="01 §3", record=True, **C11_LESSON)
    assert claims.recorded_verdict("C11") is not None
    assert claims.recorded_verdict("C11", key=store.context_key("a100", detect())) is None


def test_lesson_03_reads_back_lesson_02s_timing_of_the_pair_and_only_lesson_02s(results_dir):
    steps = [0.100, 0.101, 0.099, 0.102, 0.100, 0.098, 0.101, 0.100]
    full = time_ratio([s * 1.25 for s in steps], steps)
    claims.verdict("C5", where="02 §3", record=True, full_time=full)  # as lesson 02 records it
    assert claims.recorded_time("C5", "full_time", lesson="02") == full
    assert claims.recorded_time("C5", "full_time", lesson="01") is None
    assert claims.recorded_time("C5", "flops_ratio", lesson="02") is None  # not a time comparison
    # lesson 03's own verdict on C5 replaces the record: it is no longer lesson 02's timing
    claims.verdict("C5", where="[03 §2](#2.-The-ladder)", record=True, full_time=full)
    assert claims.recorded_time("C5", "full_time", lesson="02") is None
    with pytest.raises(ValueError, match="unknown claim"):
        claims.recorded_time("C99", "full_time", lesson="02")


def test_a_korean_kernel_judges_the_same_and_says_it_in_korean(monkeypatch):
    """Issue 28: the evidence and the shown status are Korean; the status, the basis and the
    table's status column stay the constants code reads (plots.styled_claims colours by them)."""
    monkeypatch.setenv("COURSE_LANG", "ko")
    v = verdict("C8", kept_bytes=4203520, expected_bytes=4203520, param_bytes=13293568)
    assert v.status == "busted" and v.basis == "measured"
    assert v.evidence == "유지된 바이트 4.01 MiB = 블록 입력과 토큰 id; 매개변수 12.7 MiB는 복사되지 않음"
    assert str(v).startswith("C8 반박됨 - 유지된")
    table = claims_table([v])
    assert table.loc["C8", "status"] == "busted"
    assert table.loc["C8", "says"] == "체크포인팅은 체크포인트마다 모델의 매개변수와 상태를 저장한다"


def test_every_status_verdict_and_claim_the_library_shows_has_its_korean_text():
    """The words shown from a constant (tr(status), tr(verdict), tr(CLAIMS[id])) are not literals
    test_i18n can find: each has its Korean text here."""
    from course_utils import i18n
    from course_utils.step_timing import TOO_SMALL_WHY, VERDICTS
    i18n.catalog.cache_clear()
    ko = i18n.catalog("ko")
    shown = [*STATUSES, *VERDICTS, TOO_SMALL_WHY, *CLAIMS.values(), "parameter gradients",
             "activation gradients", "keyword arguments", "context_fn (selective checkpointing)"]
    assert [s for s in shown if s not in ko] == []
