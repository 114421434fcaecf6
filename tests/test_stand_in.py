"""The T4 stand-in (``COURSE_STAND_IN=t4``, course_utils.stand_in) on a fake H200 (tests/helpers.py's
`FakeCuda`, strict where torch 2.11 is): what the switch changes in the plan (compute capability,
recipe, bf16, size profile), the allocator cap it keeps, the budgets it reads, and the words
every header and error prints. Its speed and its kernels are what no fake can show."""
from __future__ import annotations

import importlib

import pytest
import torch
from helpers import FakeCuda

from course_utils import colab, guard, hardware, search, stand_in
from course_utils.config import config_for, size_profile
from course_utils.dashboard.report import header_html
from course_utils.guard import check_feasible, cuda_memory_cap, memory_headroom
from course_utils.measure import Measurement
from course_utils.memory_model import estimate
from course_utils.terms import GiB

measure_mod = importlib.import_module("course_utils.measure")

T4_BYTES = int(14.75 * GiB)
H200 = int(139.8 * GiB)
SENTENCE = ("NVIDIA H200 standing in for a Tesla T4: its recipe, sizes and memory (14.75 GiB); "
            "not its speed")


@pytest.fixture
def h200(monkeypatch):
    """One fake NVIDIA H200 (compute capability 9.0, 139.8 GiB), no stand-in, no size override."""
    monkeypatch.delenv(stand_in.STAND_IN_ENV, raising=False)
    monkeypatch.delenv("COURSE_SIZE", raising=False)
    return FakeCuda().install(monkeypatch)


@pytest.fixture
def as_t4(h200, monkeypatch):
    monkeypatch.setenv(stand_in.STAND_IN_ENV, "t4")
    return h200


def test_the_stand_in_plans_as_a_t4_and_caps_the_allocator_to_its_memory(as_t4):
    hw = hardware.detect("cuda")
    assert hw.compute_capability == (7, 5) and hw.name == "NVIDIA H200 as a Tesla T4"
    assert not hw.native_bf16 and hw.bf16_emulated and hw.fp16_fast
    assert hw.total_memory_bytes == T4_BYTES and hw.stand_in == SENTENCE
    rec = hardware.recommend_precision(hw)
    assert (rec.precision, rec.grad_scaler, rec.low) == ("fp16", True, "fp16")
    assert hardware.is_emulated(hw, "bf16") and not hardware.is_emulated(hw, "fp16")
    with pytest.raises(ValueError, match="bf16 on NVIDIA H200 as a Tesla T4 is emulated"):
        check_feasible(config_for("smoke", device="cuda", precision="bf16"), hw)
    assert size_profile(hw) == "t4"
    # the cap: set with an index (torch 2.11 refuses "cuda"), to a T4's share of the H200
    assert ("set_per_process_memory_fraction", 0) in as_t4.calls
    assert as_t4.cap(0) == pytest.approx(T4_BYTES, abs=1)


def test_without_the_stand_in_the_gpu_plans_as_itself(h200):
    hw = hardware.detect("cuda")
    assert hw.compute_capability == (9, 0) and hw.native_bf16 and not hw.stand_in
    assert hardware.recommend_precision(hw).precision == "bf16" and size_profile(hw) == "h100"
    assert hw.total_memory_bytes == H200 and h200.fraction[0] == 1.0
    assert not any(fn == "set_per_process_memory_fraction" for fn, _ in h200.calls)


@pytest.mark.parametrize("value", ["a100", "T5", "yes"])
def test_an_unknown_stand_in_is_a_clear_error(h200, monkeypatch, value):
    monkeypatch.setenv(stand_in.STAND_IN_ENV, value)
    with pytest.raises(ValueError, match=f"COURSE_STAND_IN='{value.lower()}' names no card.*t4"):
        hardware.detect("cuda")
    for spelt in (" T4 ", "t4"):
        monkeypatch.setenv(stand_in.STAND_IN_ENV, spelt)
        assert stand_in.active() is stand_in.STAND_INS["t4"]
    monkeypatch.setenv(stand_in.STAND_IN_ENV, "")
    assert stand_in.active() is None


def test_a_temporary_budget_keeps_the_stand_ins_cap_afterwards(as_t4):
    hardware.detect("cuda")
    with cuda_memory_cap("cuda", 6 * GiB) as total:
        assert total == H200 and as_t4.cap(0) == pytest.approx(6 * GiB, abs=1)
    assert as_t4.cap(0) == pytest.approx(T4_BYTES, abs=1)  # not the whole H200 again
    with cuda_memory_cap("cuda", 50 * GiB):  # more than a T4 has: the T4's memory
        assert as_t4.cap(0) == pytest.approx(T4_BYTES, abs=1)
    with pytest.raises(RuntimeError, match="a step that fails"), cuda_memory_cap("cuda", GiB):
        raise RuntimeError("a step that fails")
    assert as_t4.cap(0) == pytest.approx(T4_BYTES, abs=1)


def test_on_a_gpu_smaller_than_the_card_the_cap_is_the_gpus_memory(monkeypatch):
    monkeypatch.setenv(stand_in.STAND_IN_ENV, "t4")
    fake = FakeCuda(name="NVIDIA RTX 3060", cc=(8, 6), total=12 * GiB).install(monkeypatch)
    hw = hardware.detect("cuda")
    assert stand_in.cap_bytes(0) == hw.total_memory_bytes == 12 * GiB and fake.fraction[0] == 1.0


def test_budgets_under_the_stand_in_count_what_the_allocator_reserved(as_t4):
    hw = hardware.detect("cuda")
    as_t4.allocate(GiB, cached=3 * GiB)  # 1 GiB allocated, 4 GiB reserved
    left = T4_BYTES - 4 * GiB            # not T4_BYTES - 1 GiB: cached blocks count against the cap
    assert stand_in.free_bytes(0) == left
    assert memory_headroom(hw) == (left, "free under the stand-in's memory cap now")
    assert search.memory_budget(0.5, "cuda") == int(0.5 * left)
    as_t4.others = H200 - 6 * GiB        # other processes leave the driver 2 GiB free: that wins
    assert memory_headroom(hw)[0] == 2 * GiB and search.memory_budget(1.0, "cuda") == 2 * GiB


def test_every_header_that_plans_from_the_stand_in_says_so(as_t4):
    hw = hardware.detect("cuda")
    report = hardware.report(hw)
    assert f"stand-in      : {SENTENCE}" in report and "recipe        : fp16 + GradScaler" in report
    setup = colab.describe_setup(hw)
    assert setup.splitlines()[1] == SENTENCE and "size profile t4" in setup
    assert "recipe fp16 autocast + GradScaler; bf16 emulated here" in setup
    base = config_for("t4", device="cuda")
    header = header_html(hw, "t4", base, hardware.recommend_precision(hw), 4.0)
    assert "NVIDIA H200 as a Tesla T4" in header and "<b>fp16</b> + GradScaler" in header


def test_a_step_a_t4_could_not_hold_runs_out_of_memory_in_the_courses_words(as_t4):
    hardware.detect("cuda")
    with pytest.raises(torch.OutOfMemoryError) as raised:
        as_t4.allocate(15 * GiB)
    assert "139.80 GiB" in str(raised.value)  # torch names the real GPU ...
    cfg = config_for("t4", device="cuda", precision="fp16", batch_size=64)
    msg = measure_mod.out_of_memory_message(cfg, "NVIDIA H200 as a Tesla T4", raised.value)
    assert msg == ("out of memory on NVIDIA H200 as a Tesla T4 at batch 64, seq 512 (fp16): the "
                   "step asked for 15.00 GiB more, beyond the 14.75 GiB of the Tesla T4 this GPU "
                   "stands in for. Try a smaller batch or sequence, a low precision, or a "
                   "checkpoint policy such as 'full'.")
    as_t4.allocate(2 * GiB, cached=GiB)
    with cuda_memory_cap("cuda", 5 * GiB), pytest.raises(torch.OutOfMemoryError) as raised:
        as_t4.allocate(3 * GiB + GiB // 2)  # under a budget inside the stand-in's memory
    words = measure_mod.describe_out_of_memory(raised.value)
    assert words == ("the step asked for 3.50 GiB more with 3.00 GiB already reserved by "
                     "PyTorch, beyond the 5.00 GiB this process's allocator may hold (a budget "
                     "inside the 14.75 GiB of the Tesla T4 this GPU stands in for)")


def test_the_batch_search_names_the_stand_ins_memory_and_searches_under_its_cap(as_t4,
                                                                                 monkeypatch):
    """A T4 stand-in on an H200 printed "allocator limited to the budget (6.63 GiB of 139.8 GiB)"."""
    hardware.detect("cuda")
    cfg = config_for("t4", device="cuda", precision="fp16")
    budget = estimate(cfg.replace(batch_size=12)).peak_allocated
    caps = []

    def fake_measure(c, **kw):  # the allocator cap in force, and the estimate as the peak
        caps.append(as_t4.cap(0))
        peak = estimate(c).peak_allocated
        if peak > as_t4.cap(0):
            return Measurement(config=c, oom=True, error="out of memory")
        return Measurement(config=c, peak_allocated=peak)
    monkeypatch.setattr(search, "measure", fake_measure)
    found = search.largest_batch(cfg, budget)
    assert found.batch_size == 12 and caps and all(abs(c - budget) <= 1 for c in caps)
    assert found.method.startswith("CUDA: allocator limited to the budget (")
    assert "GiB of the 14.75 GiB of the Tesla T4 this GPU stands in for)" in found.method
    assert "139.8" not in found.method
    assert as_t4.cap(0) == pytest.approx(T4_BYTES, abs=1)  # the stand-in's cap again afterwards
    assert guard.memory_headroom(hardware.detect("cuda"))[0] == T4_BYTES


def test_the_stand_in_judges_no_claim_from_its_step_times(as_t4):
    """An H200 as a T4 timed full checkpointing at +71 % and printed C5 "busted": the H200's
    speed, not a T4's (results/NVIDIA-H200-2026-11-27-branches, lesson 02)."""
    from course_utils.claims import verdict
    from course_utils.step_timing import time_ratio
    slow = time_ratio([1.71] * 9, [1.0] * 9, size="h100")
    for claim, inputs in [("C5", {"full_time": slow}), ("C7", {"full_time": slow}),
                          ("C20", {"per_token_time": slow})]:
        v = verdict(claim, record=False, **inputs)
        assert v.status == "not measured here" and "H200" in v.evidence, (claim, v)
    assert verdict("C4", record=False, peak_ratio=0.4, saved_ratio=0.1).status == "held"
