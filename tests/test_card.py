"""course_utils.card: the recommendation card follows its rule and its numbers, and steps down
after an out-of-memory check on CUDA."""
from __future__ import annotations

import json

import pytest
from helpers import synthetic_profile, zoo

import course_utils.guard as guard
from course_utils.card import profile_and_recommend, recommend
from course_utils.extrapolate import check_prediction, extrapolate
from course_utils.terms import MiB


def test_card_follows_its_rule_and_its_numbers():
    z = zoo("gpt")
    prof, exs, card = profile_and_recommend(
        z.build, z.make_batch, budget_bytes=64 * MiB, target_batch=8, precisions=("fp32",),
        policies=("none", "full"), batch_size=4, device="cpu", budget_s=0.05, progress=False)
    ex = exs["fp32"]
    # a generous budget: no checkpointing, one micro-batch
    assert (card.policy, card.micro_batch, card.accum_steps) == ("none", 8, 1)
    assert card.predicted_peak == ex.peak(8, "none") <= card.budget_bytes
    assert abs(card.measured_peak - card.predicted_peak) / card.measured_peak < 0.05
    assert f"micro-batch of {ex.largest_batch(64 * MiB, 'none')} fits" in card.text()
    # a budget between none's and full's peak at the measured batch: full, with accumulation
    tight = (ex.peak(4, "none") + ex.peak(4, "full")) // 2
    c2 = recommend(prof, exs, tight, target_batch=16, check=False)
    assert c2.policy == "full"
    assert c2.micro_batch * c2.accum_steps >= 16
    assert c2.micro_batch <= ex.largest_batch(tight, "full")
    assert ex.peak(c2.micro_batch, "full") <= tight
    assert f"only {ex.largest_batch(tight, 'none')} samples fit" in c2.text()
    assert json.dumps(c2.as_dict())
    with pytest.raises(ValueError, match="nothing fits"):
        recommend(prof, exs, 1024, check=False)


def test_a_cpu_check_that_would_exhaust_the_ram_is_not_run(monkeypatch):
    z = zoo("cnn")
    ex = extrapolate(z.build, z.make_batch, batches=(1, 2), device="cpu", **z.kwargs())
    # the guard's one reading of free memory (RAM and the container's limit)
    monkeypatch.setattr(guard, "memory_headroom", lambda hw: (ex.peak(4) // 2, "RAM free now"))
    c = check_prediction(ex, ex.peak(4), "none")
    assert c.batch_size == 4 and c.measured_peak is None and not c.fits
    assert "not run" in c.note and "of RAM free now" in c.note


def test_card_without_a_target_uses_the_largest_batch_without_recomputation():
    z = zoo("gpt")
    prof, exs, card = profile_and_recommend(
        z.build, z.make_batch, budget_bytes=8 * MiB, precisions=("fp32",), policies=("none", "full"),
        batch_size=2, device="cpu", budget_s=0.05, check=False, progress=False)
    largest = exs["fp32"].largest_batch(8 * MiB, "none")
    assert (card.policy, card.micro_batch, card.accum_steps) == ("none", largest, 1)
    assert card.measured_peak is None and card.check_note == "not checked"


def test_on_cuda_the_card_plans_below_the_budget_and_steps_down_after_an_out_of_memory_step(
        monkeypatch):
    # On an H100 the plan at 99.9% of the budget ran out of memory (the allocator reserves more
    # than it allocates): the card plans to CUDA_PLANNING_SHARE of the budget, and a micro-batch
    # whose real step runs out of memory is never the one recommended.
    from course_utils import card as card_module
    from course_utils.card import BACK_OFF, CUDA_PLANNING_SHARE
    from course_utils.extrapolate import PredictionCheck
    from course_utils.hardware import HardwareInfo

    z = zoo("gpt")
    prof, exs, _ = profile_and_recommend(
        z.build, z.make_batch, budget_bytes=64 * MiB, precisions=("fp32",), policies=("none",),
        batch_size=2, device="cpu", budget_s=0.05, check=False, progress=False)
    ex = exs["fp32"]
    budget = ex.peak(40, "none")
    planned = ex.largest_batch(int(budget * CUDA_PLANNING_SHARE), "none")
    assert planned < ex.largest_batch(budget, "none")
    fits_up_to = int(planned * BACK_OFF) - 1  # the first two tries run out of memory
    ran = []

    def fake_check(e, budget_bytes, policy="none", batch_size=None):
        ran.append(batch_size)
        oom = batch_size > fits_up_to
        return PredictionCheck(policy, batch_size, budget_bytes, e.peak(batch_size, policy),
                               None if oom else e.peak(batch_size, policy), None, not oom, oom,
                               "ran out of memory" if oom else "fits")
    monkeypatch.setattr(card_module, "check_prediction", fake_check)  # the card's own check
    gpu = HardwareInfo(device="cuda", name="fake GPU", compute_capability=(9, 0), native_bf16=True)
    card = recommend(prof, exs, budget, hw=gpu)
    assert ran[0] == planned and len(ran) == 3 and ran == sorted(ran, reverse=True)
    assert card.micro_batch == ran[-1] <= fits_up_to and card.measured_peak is not None
    assert card.accum_steps == 1  # no target: the largest micro-batch that ran is the target
    assert f"Planned to {CUDA_PLANNING_SHARE:.0%} of the budget" in card.text()
    assert "steps down to" in card.text()
    ran.clear()  # with a target, accumulation reaches it at the smaller micro-batch
    card = recommend(prof, exs, budget, hw=gpu, target_batch=planned)
    assert card.micro_batch <= fits_up_to and card.micro_batch * card.accum_steps >= planned


# --- the card ranks qualifying policies by their measured time ------------------------------------

def _card_for(times: dict, budget_between=("full", "none"), size="cpu", per_sample=None, hw=None,
              moved=0):
    """A card for a synthetic profile, with an extrapolation whose peaks follow the profile's
    (none the largest): the budget sits between two policies' peaks at the measured batch."""
    from course_utils.extrapolate import Extrapolation, PolicyFit
    from course_utils.hardware import HardwareInfo
    prof = synthetic_profile(times, size=size, moved=moved,
                             device="cuda" if hw is not None and hw.device == "cuda" else "cpu")
    ex = Extrapolation("toy", "fp32", "cpu", "tokens", 128, 2, 0.0, 0.0, (0.0, 0.0))
    per_sample = per_sample or {"none": 10 * MiB, "selective": 6 * MiB, "full": 4 * MiB,
                                "offload": 9 * MiB}
    for p in times:
        s = per_sample[p]
        ex.fits[p] = PolicyFit(p, (2, 4), (20 * MiB + 2 * s, 20 * MiB + 4 * s), s, 20 * MiB,
                               21 * MiB, 20 * MiB + 4 * s)
    hi, lo = (ex.peak(4, p) for p in budget_between[::-1])
    budget = (hi + lo) // 2
    cpu = HardwareInfo(device="cpu", name="a CPU", compute_capability=None, native_bf16=False)
    return recommend(prof, {"fp32": ex}, budget, target_batch=16, check=False, hw=hw or cpu)


def test_the_card_picks_the_fastest_measured_policy_that_fits():
    import re
    # every run measured selective slower than full: the card must not prefer it for less work
    slow_sel = {"none": [1.0] * 6, "selective": [1.5, 1.52, 1.49, 1.51, 1.5, 1.48],
                "full": [1.3, 1.31, 1.29, 1.3, 1.32, 1.28]}
    card = _card_for(slow_sel, budget_between=("selective", "none"))
    assert card.policy == "full"
    text = card.text()
    # the pair told by its own rounds: a verdict and a band, no point ratio the table's times
    # (each against none) could contradict (issue 24)
    assert re.search(r"selective fits too, with a step time slower than full's, round by round "
                     r"\(noise band 1\.1\d-1\.\d\dx", text)
    assert "Without checkpointing only" in text
    # selective does not fit: full, and the card says why selective was passed over
    card = _card_for(slow_sel, budget_between=("full", "selective"))
    assert card.policy == "full" and "selective does not reach a micro-batch of 4" in card.text()


def test_a_policy_timed_faster_outside_the_noise_wins_over_a_larger_micro_batch():
    # issue 24: lesson 05's card took full over selective, which its own table timed faster.
    # Here selective is faster than full by more than the noise (every round), and full fits
    # the larger micro-batch: the time decides, and the card says by how much.
    fast_sel = {"none": [1.0] * 6, "selective": [1.10, 1.11, 1.09, 1.10, 1.12, 1.08],
                "full": [1.30, 1.31, 1.29, 1.30, 1.32, 1.28]}
    card = _card_for(fast_sel, budget_between=("selective", "none"))
    opts = card.options_table()
    assert opts.loc["fp32 + full checkpointing", "largest batch"] > \
        opts.loc["fp32 + selective checkpointing", "largest batch"]
    assert card.policy == "selective"
    assert ("full fits too, with a step time slower than selective's, round by round (noise band"
            in card.text())
    assert "tie" not in card.text()


def test_within_noise_the_tie_rule_decides_and_is_stated():
    # selective's median is lower, but its band against full includes 1.00x: the medians do not
    # decide. The larger micro-batch under the budget does (full: 5 of the target 16, selective 4).
    close = {"none": [1.0] * 6, "selective": [1.28, 1.33, 1.27, 1.31, 1.29, 1.32],
             "full": [1.31, 1.30, 1.30, 1.32, 1.30, 1.29]}
    card = _card_for(close, budget_between=("selective", "none"))
    opts = card.options_table()
    full_b = opts.loc["fp32 + full checkpointing", "largest batch"]
    sel_b = opts.loc["fp32 + selective checkpointing", "largest batch"]
    assert full_b > sel_b and card.policy == "full"
    text = card.text()
    assert "selective has a step time within the noise of full's (selective against full: noise band" in text
    assert (f"The tie goes to the larger micro-batch under the budget, up to the target of 16 "
            f"(full {full_b}, selective {sel_b}), then to fewer recomputed FLOPs (selective, full): "
            "full.") in text
    # the same micro-batch: fewer recomputed FLOPs (selective), though full's median is lower
    same = {"none": 10 * MiB, "selective": 4 * MiB, "full": 4 * MiB}
    low_full = {"none": [1.0] * 6, "selective": [1.32, 1.31, 1.33, 1.30, 1.34, 1.31],
                "full": [1.30, 1.31, 1.29, 1.32, 1.30, 1.31]}
    card = _card_for(low_full, budget_between=("selective", "none"), per_sample=same)
    sel, full = (card.options_table().loc[f"fp32 + {p} checkpointing"] for p in ("selective", "full"))
    assert sel["largest batch"] == full["largest batch"] and card.policy == "selective"
    assert "full has a step time within the noise of selective's" in card.text()
    # at a size too small to time nothing is told apart: the same rule, said as such
    card = _card_for(low_full, budget_between=("selective", "none"), per_sample=same, size="smoke")
    assert card.policy == "selective" and "not told apart from selective's" in card.text()
    # the micro-batch counts up to the target only: a policy fitting far more gains nothing
    roomy = {"none": 10 * MiB, "selective": MiB, "full": MiB // 2}
    card = _card_for(close, budget_between=("selective", "none"), per_sample=roomy)
    assert card.micro_batch * card.accum_steps == 16 and card.accum_steps == 1
    assert card.policy == "selective" and "(selective 16, full 16)" in card.text()


def test_on_cuda_offloading_moves_its_bytes_and_its_time_is_said_once():
    from course_utils.hardware import HardwareInfo
    gpu = HardwareInfo(device="cuda", name="a GPU", compute_capability=(9, 0), native_bf16=True)
    times = {"none": [1.0] * 6, "full": [1.3, 1.31, 1.29, 1.3, 1.32, 1.28],
             "offload": [6.0, 6.1, 5.9, 6.0, 6.2, 5.8]}
    roomy_offload = {"none": 10 * MiB, "full": 4 * MiB, "offload": 2 * MiB}
    card = _card_for(times, budget_between=("full", "none"), hw=gpu, moved=100 * MiB,
                     per_sample=roomy_offload)
    text = card.text()
    assert card.policy == "full"
    assert "Offloading moved 100.0 MiB per step to the host and back (measured at micro-batch 4)." in text
    # a candidate: its time is said once, against the policy chosen, not again against none's
    assert "offload fits too, with a step time slower than full's, round by round (noise band" in text
    assert text.count("x slower") == 1 and text.count("slower than") == 2, text  # said once each
    # not a candidate (it does not reach the measured micro-batch): its time, once, in that sentence
    text = _card_for(times, budget_between=("full", "none"), hw=gpu, moved=100 * MiB).text()
    assert "offload does not reach a micro-batch of 4" in text
    assert "(measured at micro-batch 4): a step time 6.00x slower than no checkpointing" in text
    assert text.count("6.00x slower") == 1


def test_the_cards_options_table_is_readable():
    import re
    card = _card_for({"none": [1.0] * 6, "full": [1.3, 1.31, 1.29, 1.3, 1.32, 1.28]})
    opts = card.options_table()
    assert list(opts.index) == ["fp32", "fp32 + full checkpointing"]
    assert "emulated" not in opts.columns and opts.shape[1] + 1 <= 7
    cell = opts.loc["fp32 + full checkpointing", "time vs none"]
    assert re.fullmatch(r"1\.30x slower \(\d\.\d\d-\d\.\d\dx\)", cell), cell
    assert "IQR" not in card.text()
    assert json.dumps(card.as_dict())


def test_a_policy_that_changed_the_gradients_is_never_recommended(monkeypatch):
    # On an H100, Hugging Face's GPT-2 (dropout 0.1) under 'selective' changed the first step's
    # gradients by 0.034 where 'full' was bit for bit equal: the fastest policy that fits is then
    # left out, with the reason, and the profile's sentence says CHANGED, not rounding.
    from helpers import synthetic_profile

    from course_utils.profiling import GRADIENT_ROUNDING, ProfileMeasurement
    times = {"none": [1.0] * 6, "selective": [1.1, 1.11, 1.09, 1.1, 1.12, 1.08],
             "full": [1.3, 1.31, 1.29, 1.3, 1.32, 1.28]}
    assert _card_for(times, budget_between=("selective", "none")).policy == "selective"
    real = synthetic_profile

    def with_changed_selective(*args, **kwargs):
        prof = real(*args, **kwargs)
        for m in prof.measurements:
            m.grad_scale = 2.0
            if m.config.checkpoint == "selective":
                m.grad_max_diff = 0.034
        return prof
    monkeypatch.setitem(_card_for.__globals__, "synthetic_profile", with_changed_selective)
    card = _card_for(times, budget_between=("selective", "none"))
    assert card.policy == "full"
    assert "selective is left out: it changed the first step's gradients beyond rounding" in card.text()
    prof = with_changed_selective(times)
    assert "selective CHANGED them" in prof.gradients_text()
    # rounding is not a change: fp32 at 1e-6 of the largest gradient, bf16 within 2^-8 of it
    m = ProfileMeasurement(config=prof.measurements[1].config, grad_max_diff=2e-6, grad_scale=2.0)
    assert not m.gradients_changed and GRADIENT_ROUNDING["fp32"] * 2.0 < 0.034
    m.grad_max_diff = float("inf")  # a gradient missing on one side
    assert m.gradients_changed


def test_the_card_points_to_a_chunked_loss_when_the_logits_outweigh_the_blocks():
    """Issue 26: at a Llama-3-sized vocabulary the head's logits and the loss's copies, saved
    outside the blocks where no checkpoint policy reaches, outweigh the blocks' saved tensors;
    the card then names a chunked cross-entropy. At a byte vocabulary it does not."""
    pytest.importorskip("transformers")
    from course_utils import model_zoo
    texts = {}
    for vocab in (256, 128_256):
        z = model_zoo.hf_causal_lm("llama", n_layers=2, d_model=32, n_heads=2, seq_len=16,
                                   vocab_size=vocab)
        prof, _exs, card = profile_and_recommend(
            z.build, z.make_batch, budget_bytes=512 * MiB, precisions=("fp32",),
            policies=("none", "full"), batch_size=4, device="cpu", budget_s=0.05,
            progress=False, check=False)
        by_block = prof.saved_by_block("fp32", card.policy)["MiB"]
        outside = by_block["outside the blocks"]
        texts[vocab] = (card.text(), outside > by_block.drop("outside the blocks").sum())
    assert texts[128_256][1] and "chunked cross-entropy" in texts[128_256][0]
    assert not texts[256][1] and "chunked cross-entropy" not in texts[256][0]


def test_a_korean_kernel_gets_the_card_and_the_profile_in_korean(monkeypatch):
    """Issue 28: under COURSE_LANG=ko the card's sentences and the profile's words are Korean;
    the card's fields (policy, verdict) and the tables' column names stay English."""
    monkeypatch.setenv("COURSE_LANG", "ko")
    close = {"none": [1.0] * 6, "selective": [1.28, 1.33, 1.27, 1.31, 1.29, 1.32],
             "full": [1.31, 1.30, 1.30, 1.32, 1.30, 1.29]}
    card = _card_for(close, budget_between=("selective", "none"))
    text = card.text()
    assert card.policy == "full" and text.startswith("cpu에서 toy에 대한 추천\n  레시피      : fp32 + 전체")
    assert "selective의 스텝 시간은 full과(와) 노이즈 범위 안에서 같으므로" in text
    assert "동률이면 목표 16까지에서 예산 안의 마이크로배치가 더 큰 쪽" in text
    assert "the larger micro-batch" not in text and "largest batch" in card.options_table()
    prof = synthetic_profile(close)
    assert prof.gradients_text() == "'none' 대비 첫 스텝의 그래디언트, 구성 3개 모두에서: 비트 단위로 같음"
    assert prof.time_text(prof.measurements[0]) == "1.00x (기준)"
    with pytest.raises(KeyError, match="프로파일링하지 않았습니다: 측정한 것은"):
        prof.get("bf16", "full")
