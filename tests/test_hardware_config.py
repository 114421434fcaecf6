"""Hardware detection (mocked GPUs and CPUs), the plan it implies, threads, and RunConfig
validation."""
from types import SimpleNamespace

import pytest
import torch

from course_utils import config as cfgmod
from course_utils import hardware
from course_utils.config import ModelShape, RunConfig, config_for, size_profile
from course_utils.experiments import ladder
from course_utils.guard import check_feasible
from course_utils.hardware import is_emulated


def fake_cuda(monkeypatch, name, cc, mem_gib):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(name=name, total_memory=int(mem_gib * 2**30)))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: cc)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (int(mem_gib * 2**30 * 0.9),
                                                                int(mem_gib * 2**30)))

    def is_bf16_supported(including_emulation=True):
        # What torch reports: True on a T4 when emulation counts (including_emulation=True).
        return True if including_emulation else cc >= (8, 0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)


@pytest.mark.parametrize("name,cc,mem,precision,scaler,size", [
    ("Tesla T4", (7, 5), 15, "fp16", True, "t4"),
    ("Tesla V100-SXM2-16GB", (7, 0), 16, "fp16", True, "t4"),
    ("NVIDIA A100-SXM4-40GB", (8, 0), 40, "bf16", False, "a100"),
    ("NVIDIA H100 80GB HBM3", (9, 0), 80, "bf16", False, "h100"),
    ("Tesla K80", (3, 7), 12, "fp32", False, "t4"),
])
def test_gpu_recommendation(monkeypatch, name, cc, mem, precision, scaler, size):
    fake_cuda(monkeypatch, name, cc, mem)
    monkeypatch.delenv("COURSE_SIZE", raising=False)
    hw = hardware.detect("cuda")
    rec = hardware.recommend_precision(hw)
    assert (rec.precision, rec.grad_scaler) == (precision, scaler)
    assert name in rec.reason
    assert size_profile(hw) == size


def test_t4_bf16_is_flagged_as_emulated(monkeypatch):
    fake_cuda(monkeypatch, "Tesla T4", (7, 5), 15)
    hw = hardware.detect("cuda")
    assert hw.bf16_emulated and not hw.native_bf16
    assert is_emulated(hw, "bf16") and not is_emulated(hw, "fp16")
    assert "emulated" in hardware.recommend_precision(hw).reason
    with pytest.raises(ValueError, match="emulated"):
        check_feasible(config_for("smoke", device="cuda", precision="bf16"), hw)


def fake_cpu(monkeypatch, **flags):
    caps = {"cpu_name": "Test CPU", "avx2": True, **flags}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps, raising=False)  # absent before 2.7
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)


@pytest.mark.parametrize("flags,precision,words", [
    ({"avx512_f": True, "avx512_bf16": True}, "bf16", "AVX-512 BF16"),
    ({"avx512_f": True, "amx_bf16": True}, "bf16", "AMX"),
    ({"avx512_f": True}, "fp32", "no bf16 instructions"),
    ({}, "fp32", "AVX2"),
])
def test_cpu_recommendation(monkeypatch, flags, precision, words):
    fake_cpu(monkeypatch, **flags)
    hw = hardware.detect("cpu")
    rec = hardware.recommend_precision(hw)
    assert rec.precision == precision and not rec.grad_scaler and rec.low == "bf16"
    assert words in rec.reason
    assert "Test CPU" in hardware.report(hw)
    assert is_emulated(hw, "bf16") == (precision == "fp32")
    # the fp16 line names the hardware feature, and never calls fp16 "fast" (a probe measures it)
    assert "native fp16   : no (emulated)" in hardware.report(hw) and "fast" not in hardware.report(hw)


def test_report_names_the_fp16_instructions(monkeypatch):
    fake_cpu(monkeypatch, avx512_f=True, amx_bf16=True, avx512_fp16=True)
    text = hardware.report(hardware.detect("cpu"), {"fp32": 1.0, "bf16": 0.44, "fp16": 1.18})
    assert "native fp16   : yes (avx512_fp16)" in text and "fp16 1.18x fp32's time" in text
    tiny = hardware.report(hardware.detect("cpu"), {"fp32": 1.0, "bf16": 0.0041, "fp16": 0.85})
    assert "bf16 0.0041x fp32's time" in tiny   # a loaded machine once printed "bf16 0.00x"


def test_isa_caps_make_a_bf16_cpu_plan_like_an_avx2_one(monkeypatch):
    """ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 (issue 9): torch's kernels then run as on
    an AVX2-only CPU, and the course must plan as it would there."""
    fake_cpu(monkeypatch, avx512_f=True, avx512_bf16=True, amx_bf16=True)
    assert hardware.recommend_precision(hardware.detect("cpu")).precision == "bf16"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    hw = hardware.detect("cpu")
    assert not hw.native_bf16 and not hw.cpu_features["avx512_f"] and hw.cpu_features["avx2"]
    rec = hardware.recommend_precision(hw)
    assert rec.precision == "fp32" and "AVX2" in rec.reason and "ONEDNN_MAX_CPU_ISA" in rec.reason
    assert "capped by" in hardware.report(hw)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")  # bf16 allowed, AMX not
    hw = hardware.detect("cpu")
    assert hw.native_bf16 and hw.cpu_features["avx512_bf16"] and not hw.cpu_features["amx_bf16"]


def test_ladder_pairs_differ_by_one_technique(monkeypatch):
    """Where the recipe is fp32, checkpointing is compared in fp32 and bf16 is measured for its
    memory; where it is bf16, the checkpointing pair is in bf16."""
    base = config_for("smoke", device="cpu")
    fake_cpu(monkeypatch, avx512_f=True)
    rows = [(c.precision, c.checkpoint) for c in ladder(base, hardware.detect("cpu"))]
    assert rows == [("fp32", "none"), ("fp32", "full"), ("fp32", "selective"), ("bf16", "none")]
    fake_cpu(monkeypatch, avx512_f=True, avx512_bf16=True)
    rows = [(c.precision, c.checkpoint) for c in ladder(base, hardware.detect("cpu"))]
    assert rows == [("fp32", "none"), ("bf16", "none"), ("bf16", "full"), ("bf16", "selective")]
    fake_cuda(monkeypatch, "Tesla T4", (7, 5), 15)
    rows = [(c.precision, c.checkpoint) for c in ladder(base.replace(device="cuda"),
                                                         hardware.detect("cuda"))]
    assert rows == [("fp32", "none"), ("fp16", "none"), ("fp16", "full"), ("fp16", "selective")]


def test_cpu_without_bf16_notes_but_runs(monkeypatch):
    fake_cpu(monkeypatch, avx512_f=True)
    notes = check_feasible(config_for("smoke", device="cpu", precision="bf16"),
                           hardware.detect("cpu"))
    assert any("emulated" in n for n in notes)


def test_fp16_on_cpu_refused_unless_tiny(monkeypatch):
    fake_cpu(monkeypatch, avx512_f=True, avx512_bf16=True)
    hw = hardware.detect("cpu")
    with pytest.raises(ValueError, match="emulated"):
        check_feasible(config_for("cpu", device="cpu", precision="fp16"), hw)
    assert check_feasible(config_for("cpu", device="cpu", precision="fp16"), hw, force=True)
    check_feasible(config_for("smoke", device="cpu", precision="fp16"), hw)  # tiny: allowed


def test_threads_obey_omp_num_threads_and_back_off_beside_busy_processes(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        choice = hardware.use_threads()
        assert choice.threads == 1 == torch.get_num_threads() and "OMP_NUM_THREADS" in choice.reason
        monkeypatch.delenv("OMP_NUM_THREADS")
        monkeypatch.setattr(hardware, "_usable_cores", lambda: 4)
        monkeypatch.setattr(hardware, "_cpu_busy", lambda s: 2.1)  # another process: 2 cores
        choice = hardware.use_threads()
        assert choice.threads == 2 == torch.get_num_threads() and "busy" in choice.reason
        monkeypatch.setattr(hardware, "_cpu_busy", lambda s: 3.9)
        assert hardware.use_threads().threads == 1  # never fewer than one
        monkeypatch.setattr(hardware, "_cpu_busy", lambda s: 0.1)
        assert hardware.use_threads().threads == 4
    finally:
        torch.set_num_threads(before)


def test_missing_devices_are_clear_errors(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="no CUDA GPU"):
        hardware.detect("cuda")
    with pytest.raises(ValueError, match="unknown device"):
        hardware.detect("tpu")
    from course_utils.models import build_model
    with pytest.raises(ValueError, match="no CUDA GPU"):
        build_model(config_for("smoke", device="cuda"))


@pytest.mark.parametrize("kw,match", [
    ({"precision": "fp8"}, "unknown precision"),
    ({"batch_size": 0}, "batch_size must be a positive integer"),
    ({"seq_len": -1}, "seq_len"),
    ({"seq_len": 0}, "seq_len must be a positive integer"),
    ({"d_model": 100, "n_heads": 3}, "divisible"),
    ({"checkpoint": "sometimes"}, "unknown policy"),
    ({"checkpoint": "every-9", "n_layers": 4}, "outside 1..4"),
    ({"checkpoint": "segments:0"}, "outside"),
    ({"checkpoint": "memory-budget:1.5"}, "outside 0..1"),
    ({"attention": "flash3"}, "unknown attention"),
    ({"device": "tpu"}, "unknown device"),
    ({"grad_accum_steps": 0}, "grad_accum_steps"),
])
def test_config_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        config_for("smoke", **kw)


def test_policy_error_names_the_valid_ones():
    with pytest.raises(ValueError) as e:
        config_for("smoke", checkpoint="half")
    for name in ("none", "full", "every-K", "segments:N", "selective", "memory-budget:B"):
        assert name in str(e.value)


def test_shape_inside_config():
    c = config_for("smoke", n_layers=3)
    assert isinstance(c.shape, ModelShape) and c.n_layers == c.shape.n_layers == 3
    d = c.replace(d_model=128, batch_size=2)
    assert (d.d_model, d.batch_size, d.shape.d_model, c.d_model) == (128, 2, 128, 64)
    with pytest.raises(ValueError, match="unknown RunConfig field"):
        c.replace(layers=3)
    with pytest.raises(ValueError, match="ModelShape"):
        RunConfig(shape={"n_layers": 2})
    assert c.as_dict()["n_layers"] == 3 and "shape" not in c.as_dict()


def test_size_profile_env_override(monkeypatch):
    monkeypatch.setenv("COURSE_SIZE", "cpu")
    assert size_profile() == "cpu"
    assert config_for().d_model == cfgmod.SIZE_PROFILES["cpu"]["d_model"]
    monkeypatch.setenv("COURSE_SIZE", "huge")
    with pytest.raises(ValueError, match="COURSE_SIZE"):
        size_profile()
    with pytest.raises(ValueError, match="unknown RunConfig field"):
        config_for("smoke", layers=3)


def test_label_and_tokens():
    c = config_for("smoke", precision="bf16", checkpoint="full", grad_accum_steps=2, batch_size=3,
                   seq_len=5)
    assert c.label == "bf16+full+accum2"
    assert c.tokens_per_step == 30


# --- Apple Silicon (MPS, mocked: no peak-memory counter) -----------------------------------

def test_memory_device_is_the_cpu_in_place_of_mps(monkeypatch):
    assert hardware.memory_device("mps") == "cpu"
    assert hardware.memory_device("cuda:1") == "cuda:1" and hardware.memory_device("cpu") == "cpu"
    monkeypatch.setattr(hardware, "default_device", lambda: "mps")
    assert hardware.memory_device() == "cpu"
    with pytest.raises(ValueError):
        hardware.memory_device("tpu")


def test_the_report_says_that_peaks_are_measured_on_the_cpu(monkeypatch):
    monkeypatch.setattr(hardware, "_mps_available", lambda: True)
    mps = hardware.detect("mps")
    assert "peak memory   : measured on the CPU (MPS has no peak-memory counter)" in \
        hardware.report(mps)
    assert "MPS           : available, but it has no peak-memory counter" in \
        hardware.report(hardware.detect("cpu"))
    monkeypatch.setattr(hardware, "_mps_available", lambda: False)
    assert "MPS" not in hardware.report(hardware.detect("cpu"))


def test_an_mps_step_gets_its_peak_from_the_cpu_and_says_so(monkeypatch):
    """`memory_step` of a model on MPS (mocked: its tensors stay on the CPU here) times the
    step on MPS and takes the peak of the same step on a CPU copy: the bytes equal those of
    the same configuration measured on the CPU, ``peak_method`` says how, and the step
    counter of the run (a wrapper with ``__wrapped__``) sees only the MPS step."""
    from course_utils.measure import memory_step, warm_up
    from course_utils.training import setup, train_step
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
