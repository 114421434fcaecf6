"""course_utils.extrapolate: the peak at any batch from two measured ones."""
from __future__ import annotations

import pytest
from helpers import zoo

from course_utils import model_zoo
from course_utils.config import config_for
from course_utils.extrapolate import check_prediction, extrapolate
from course_utils.memory_model import estimate


def test_extrapolation_within_5_percent_of_the_analytic_model_at_4x():
    # the cpu profile's width (at the smoke width the analytic model itself is off by ~6 %,
    # memory_model's docstring), 2 blocks to stay quick; measured at batches 4 and 8
    cfg = config_for("cpu", n_layers=2, device="cpu")
    z = model_zoo.course_gpt("cpu", n_layers=2)
    ex = extrapolate(z.build, z.make_batch, policies=("none", "full", "every-2"), batches=(4, 8))
    big = 4 * 8
    predicted = ex.peak(big, "none")
    analytic = estimate(cfg.replace(batch_size=big)).peak_allocated
    assert abs(predicted - analytic) / analytic < 0.05, (predicted, analytic)
    for policy in ("none", "full", "every-2"):  # the block model's saved bytes: exact
        assert ex.saved(big, policy) == estimate(cfg.replace(batch_size=big,
                                                             checkpoint=policy)).saved_total
    assert ex.saved(big, "selective") is None
    # in bf16 each block also saves autocast's weight copies, whatever the batch: the block
    # model keeps them as a constant (lesson 05 printed 178.72 MiB against the analytic 160.72
    # when it scaled them with the batch)
    bf = extrapolate(z.build, z.make_batch, precision="bf16", policies=("none", "full"),
                     batches=(4, 8))
    assert bf.block_const > 0
    for policy in ("none", "full"):
        assert bf.saved(big, policy) == estimate(cfg.replace(
            precision="bf16", batch_size=big, checkpoint=policy)).saved_total
    # one real step at the batch predicted to fill a budget
    budget = ex.peak(big, "full")
    check = check_prediction(ex, budget, "full")
    assert check.batch_size == ex.largest_batch(budget, "full") >= big
    assert abs(check.error) < 0.03, check.note
    with pytest.raises(ValueError, match="not even batch 1"):
        check_prediction(ex, 1024, "none")


def test_extrapolation_arguments():
    z = zoo("cnn")
    with pytest.raises(ValueError, match="two increasing"):
        extrapolate(z.build, z.make_batch, batches=(4, 2), **z.kwargs())


def test_on_cuda_the_check_plans_below_the_budget_and_an_out_of_memory_step_says_what_to_try(
        monkeypatch):
    # On an H200 lesson 05's check ran out of memory at the batch predicted to fill its budget,
    # with less allocated than predicted: the budget caps reserved memory. The check now plans to
    # CUDA_PLANNING_SHARE of the budget, and its note names the allocator setting by its torch
    # 2.13 name, PYTORCH_ALLOC_CONF.
    import contextlib
    import dataclasses

    import course_utils.extrapolate as extrapolate_module
    from course_utils.extrapolate import CUDA_PLANNING_SHARE
    from course_utils.profiling import ProfileMeasurement

    z = zoo("cnn")
    ex = extrapolate(z.build, z.make_batch, batches=(1, 2), device="cpu", **z.kwargs())
    ex.spec = dataclasses.replace(ex.spec, device="cuda")
    budget = ex.peak(40)
    ran = []

    def out_of_memory(spec, cfg, **kw):
        ran.append(cfg.batch_size)
        m = ProfileMeasurement(config=cfg, oom=True)
        m.error = ("out of memory on a GPU at batch 9 (fp32): CUDA out of memory. Tried to allocate "
                   "192.00 MiB. GPU 0 has a total capacity of 139.80 GiB. If reserved but unallocated "
                   "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
        return m, None, []
    monkeypatch.setattr(extrapolate_module, "measure_config", out_of_memory)
    monkeypatch.setattr(extrapolate_module, "cuda_memory_cap", lambda device, b: contextlib.nullcontext())
    c = check_prediction(ex, budget, "none")
    assert ran == [ex.largest_batch(int(budget * CUDA_PLANNING_SHARE))] and ran[0] < 40
    assert c.oom and not c.fits and c.measured_peak is None
    assert "the step asked for 192.00 MiB more" in c.note
    assert "PYTORCH_ALLOC_CONF=expandable_segments:True" in c.note
    assert "PYTORCH_CUDA_ALLOC_CONF" not in c.note and "prediction was too low" not in c.note
