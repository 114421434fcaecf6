"""course_utils.measure: the meter and its one core (set-up, warm-up, memory step, emulated time,
the one out-of-memory message), shared by measure() and compare(); CPU and MPS peaks; nothing
left behind."""
import gc
import sys

import pytest
import torch

import course_utils.measure  # noqa: F401 - the module (course_utils.measure is the function)
from course_utils.config import config_for
from course_utils.data import get_batch
from course_utils.experiments import compare
from course_utils.measure import measure
from course_utils.memory_model import estimate, parameter_count
from course_utils.models import build_model
from course_utils.saved_tensors import measure_saved, saved_by_module, saved_bytes
from course_utils.training import setup, train_step

measure_mod = sys.modules["course_utils.measure"]


SMOKE = config_for("smoke", device="cpu")


def live_tensor_bytes() -> int:
    """Bytes of every distinct tensor storage that Python can still reach (the CPU stand-in for
    CUDA's memory_allocated, which the CUDA peak reads)."""
    gc.collect()
    seen = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor):
            try:  # a tensor another test left (a compile's fake tensor) has no data to count
                if obj.device.type != "cpu":
                    continue
                st = obj.untyped_storage()
                seen[st.data_ptr()] = st.nbytes()
            except (RuntimeError, NotImplementedError):
                continue
    return sum(seen.values())


def test_measure_and_compare_leave_no_tensors_behind():
    """Issue 9: with the leak, each measurement left its graph and parameters allocated, so the
    CUDA path's absolute max_memory_allocated would have carried earlier runs into later peaks."""
    cfg = SMOKE.replace(n_layers=2)
    measure(cfg, steps=1)  # first-call caches (corpus, kernels) before the baseline
    base = live_tensor_bytes()
    x, y = get_batch(cfg.batch_size, cfg.seq_len)
    base = live_tensor_bytes()

    def forward_only(policy):  # no backward ever frees these graphs
        model = build_model(cfg.replace(checkpoint=policy))
        measure_saved(model, x, y, "bf16")
        saved_bytes(lambda: model(x, y), model=model)
        saved_by_module(model, lambda: model(x, y))

    for policy in ("none", "full", "selective"):
        forward_only(policy)
        measure(cfg.replace(checkpoint=policy), steps=1)
    compare([cfg, cfg.replace(checkpoint="full")], steps=2, progress=False)
    assert live_tensor_bytes() - base < 64 * 1024  # nothing of a model or graph is left


def test_cpu_peak_is_reported_and_checkpointing_lowers_it():
    none = measure(SMOKE.replace(n_layers=4), timed=False)
    full = measure(SMOKE.replace(n_layers=4, checkpoint="full"), timed=False)
    assert none.peak_allocated is not None and full.peak_allocated is not None
    assert "profiler" in none.peak_method
    assert none.peak_allocated > full.peak_allocated
    # the peak includes what is alive before the step: parameters and AdamW state
    assert none.peak_allocated > none.parameters + none.optimizer_state
    assert none.step_time_s is None and not none.step_times_s  # timed=False: memory only


def test_a_tiny_warm_up_gives_the_same_memory_as_a_full_one():
    """Emulated precisions warm up on one short sequence (a full step there takes seconds); the
    memory step after it must read the same bytes as after a full warm-up step."""
    cfg = config_for("smoke", device="cpu", n_layers=2, batch_size=8)
    full = setup(cfg)
    measure_mod.warm_up(full, 1)
    tiny = setup(cfg)
    measure_mod.warm_up(tiny, 1, tiny=True)
    a, b = measure_mod.memory_step(full), measure_mod.memory_step(tiny)
    for f in ("parameters", "gradients", "optimizer_state", "activations", "logits"):
        assert a[f] == b[f], f
    assert b["peak_allocated"] == pytest.approx(a["peak_allocated"], rel=0.02)


def test_measurement_fields_match_the_estimate_exactly_where_closed_form():
    m = measure(SMOKE, steps=3)
    e = estimate(SMOKE)
    n = parameter_count(SMOKE)
    assert m.parameters == e.parameters == 4 * n
    assert m.gradients == e.gradients
    assert m.optimizer_state == e.optimizer_state  # AdamW: 8 bytes/param + step counters
    assert len(m.step_times_s) == 3 and m.step_time_s > 0 and m.step_time_iqr_s >= 0
    assert m.tokens_per_s == pytest.approx(SMOKE.tokens_per_step / m.step_time_s)
    assert m.peak_allocated == pytest.approx(e.peak_allocated, rel=0.25)


def test_an_emulated_precision_is_timed_with_one_step_and_labelled(monkeypatch):
    from course_utils import hardware
    monkeypatch.setattr(torch.cpu, "get_capabilities",
                        lambda: {"cpu_name": "AVX2 CPU", "avx2": True}, raising=False)
    m = measure(SMOKE.replace(precision="bf16"), budget_s=5)
    assert m.emulated and len(m.step_times_s) == 1 and "emulated" in m.timing
    assert m.activations > 0 and m.peak_allocated > 0  # memory is measured as everywhere
    assert hardware.is_emulated(hardware.detect("cpu"), "bf16")


def test_measure_validates_its_arguments():
    for kw, match in (({"steps": -1}, "steps"), ({"steps": 0}, "steps"), ({"warmup": 0}, "warmup"),
                      ({"budget_s": 0}, "budget_s")):
        with pytest.raises(ValueError, match=match):
            measure(SMOKE, **kw)
    with pytest.raises(ValueError, match="steps"):
        compare([SMOKE], steps=0, progress=False)
    with pytest.raises(ValueError, match="at least one"):
        compare([], progress=False)


def test_out_of_memory_is_reported_not_raised(monkeypatch):
    def boom(config, **kw):
        raise measure_mod.OutOfMemory("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(measure_mod, "setup", boom)
    m = measure(SMOKE, timed=False)
    assert m.oom and "smaller batch" in m.error and "2.00 GiB" in m.error
    assert m.peak_allocated is None
    assert measure(SMOKE.replace(batch_size=1), timed=False).oom is True  # still callable


def test_measure_and_compare_share_one_out_of_memory_message(monkeypatch):
    """The same failure reads the same in `measure` and in `compare` (the core's one message),
    and the CPU allocator's untyped RuntimeError counts as running out of memory."""
    cpu_error = RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
                             "can't allocate memory: you tried to allocate 1125899906842624 bytes.")

    def boom(config, **kw):
        raise cpu_error
    monkeypatch.setattr(measure_mod, "setup", boom)
    alone = measure(SMOKE, timed=False)
    together = compare([SMOKE], timed=False, progress=False)
    assert alone.oom and together["oom"].tolist() == [True]
    assert alone.error == together["error"][0] == measure_mod.out_of_memory_message(
        SMOKE, alone.device_name, cpu_error)
    assert "at batch 4, seq 32 (fp32)" in alone.error
    assert "asked for 1,048,576.00 GiB more, more than the RAM left" in alone.error  # 2^50 bytes
    assert measure_mod.ran_out_of_memory(cpu_error)
    assert not measure_mod.ran_out_of_memory(RuntimeError("shape mismatch"))

    def other(config, **kw):
        raise RuntimeError("shape mismatch")
    monkeypatch.setattr(measure_mod, "setup", other)
    with pytest.raises(RuntimeError, match="shape mismatch"):  # not memory: it escapes
        measure(SMOKE, timed=False)


def test_compare_survives_running_out_of_memory_while_timing(monkeypatch):
    """On a GPU, every configuration's model is alive while they are timed in alternation; an
    out-of-memory error there keeps the memory measured and says what to do."""
    def boom(*args, **kwargs):
        raise measure_mod.OutOfMemory("CUDA out of memory. Tried to allocate 1.00 GiB")
    monkeypatch.setattr(measure_mod, "interleaved", boom)
    df = compare([SMOKE, SMOKE.replace(checkpoint="full")], progress=False)
    assert (df["peak_allocated"] > 0).all() and df["step_time_s"].isna().all()
    assert df["error"].str.contains("compare fewer").all()
    assert set(df["time_verdict"]) <= {"reference", "not timed"}


def test_an_mps_step_gets_its_peak_from_the_cpu_and_says_so(monkeypatch):
    """`memory_step` of a model on MPS (mocked: its tensors stay on the CPU here) times the
    step on MPS and takes the peak of the same step on a CPU copy: the bytes equal those of
    the same configuration measured on the CPU, ``peak_method`` says how, and the step
    counter of the run (a wrapper with ``__wrapped__``) sees only the MPS step."""
    from course_utils.measure import memory_step, warm_up
    from course_utils.training import setup
    monkeypatch.setattr(torch.mps, "synchronize", lambda: None)
    cfg = config_for("smoke", device="cpu", checkpoint="full")
    ref = setup(cfg)
    warm_up(ref, 1)
    on_cpu = memory_step(ref)

    steps = []

    def counted(*args, **kwargs):
        steps.append(1)
        return train_step(*args, **kwargs)
    counted.__wrapped__ = train_step
    state = setup(cfg, step_fn=counted)
    warm_up(state, 1)
    state.config = cfg.replace(device="mps")  # what memory_step reads the device from
    steps.clear()
    got = memory_step(state)
    # The CPU step runs inside memory_step's saved-tensor meter and hooks, the copy's does not:
    # a few KiB apart at most.
    assert got["peak_allocated"] == pytest.approx(on_cpu["peak_allocated"], rel=0.01)
    assert abs(got["peak_allocated"] - on_cpu["peak_allocated"]) <= 16 * 1024
    assert got["peak_method"].startswith("CPU fallback, MPS has no peak-memory counter")
    assert on_cpu["peak_method"].startswith("CPU:") and len(steps) == 1
    assert got["activations"] == on_cpu["activations"]  # the saved tensors: the MPS step's


def test_a_korean_kernel_says_what_ran_out_in_korean_with_the_same_bytes(monkeypatch):
    """Issue 28: the one out-of-memory message in Korean, the sizes as in English; the words a
    caller passes (TOGETHER) and the constants shown from code have their Korean text."""
    from course_utils import i18n
    from course_utils.hardware import MPS_PEAK_NOTE
    from course_utils.measure import EMULATED_TIMING, TOGETHER, out_of_memory_message
    error = torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 24.00 MiB. GPU 0 has a total capacity of 79.10 GiB"
        " of which 20.00 MiB is free. Of the allocated memory 1.00 GiB is allocated by PyTorch, "
        "and 170.00 MiB is reserved by PyTorch but unallocated.")
    cfg = config_for("smoke", device="cpu")
    english = out_of_memory_message(cfg, "NVIDIA H100", error, TOGETHER)
    monkeypatch.setenv("COURSE_LANG", "ko")
    korean = out_of_memory_message(cfg, "NVIDIA H100", error, TOGETHER)
    assert korean.startswith("NVIDIA H100에서 메모리 부족, 배치 4, 시퀀스 32 (fp32), 구성들의")
    assert "PyTorch가 이미 1.17 GiB를 예약한 상태에서 스텝이 24.00 MiB를 더 요청함" in korean
    for size in ("24.00 MiB", "1.17 GiB", "79.10 GiB", "20.00 MiB"):
        assert size in english and size in korean
    i18n.catalog.cache_clear()
    assert all(t in i18n.catalog("ko") for t in (EMULATED_TIMING, TOGETHER, MPS_PEAK_NOTE))
