"""course_utils.card: the recommendation card follows its rule and its numbers, and steps down
after an out-of-memory check on CUDA."""
from __future__ import annotations

import json

import pytest
from helpers import zoo

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
    assert "Planned to 95% of the budget" in card.text() and "steps down to" in card.text()
    ran.clear()  # with a target, accumulation reaches it at the smaller micro-batch
    card = recommend(prof, exs, budget, hw=gpu, target_batch=planned)
    assert card.micro_batch <= fits_up_to and card.micro_batch * card.accum_steps >= planned
