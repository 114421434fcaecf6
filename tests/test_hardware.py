"""course_utils.hardware: detection on mocked GPUs and CPUs, the recipe it implies, ISA caps,
threads, missing devices, and MPS's peak measured on the CPU."""

import pytest
import torch
from helpers import fake_cpu, fake_cuda

from course_utils import hardware, i18n
from course_utils.config import config_for, size_profile
from course_utils.guard import check_feasible
from course_utils.hardware import is_emulated


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


def test_threads_obey_omp_num_threads_and_back_off_beside_busy_processes(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        choice = hardware.use_threads()
        assert choice.threads == 1 == torch.get_num_threads() and "OMP_NUM_THREADS" in choice.reason
        monkeypatch.delenv("OMP_NUM_THREADS")
        monkeypatch.setattr(hardware, "usable_cores", lambda: 4)
        monkeypatch.setattr(hardware, "_cpu_busy", lambda s: 2.1)  # another process: 2 cores
        choice = hardware.use_threads()
        assert choice.threads == 2 == torch.get_num_threads() and "busy" in choice.reason
        monkeypatch.setattr(hardware, "_cpu_busy", lambda s: 3.9)
        assert hardware.use_threads().threads == 1  # never fewer than one
        monkeypatch.setattr(hardware, "_cpu_busy", lambda s: 0.1)
        assert hardware.use_threads().threads == 4
    finally:
        torch.set_num_threads(before)


def test_a_kept_thread_choice_is_said_in_the_language_of_the_kernel_that_reads_it(monkeypatch,
                                                                                  tmp_path):
    """The store keeps the numbers, not an English sentence (issue 28: a Korean lesson printed
    the reason an English kernel had stored)."""
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr(hardware.store, "in_notebook", lambda: True)
    monkeypatch.setattr(hardware, "usable_cores", lambda: 2)
    monkeypatch.setattr(hardware, "_cpu_busy", lambda s: 1.0)
    monkeypatch.setattr(i18n, "catalog", lambda lang: {
        "{cores} usable core(s), {busy:.1f} kept busy by other processes: using {free}":
            "사용 가능한 코어 {cores}개 중 {busy:.1f}개가 다른 프로세스로 바쁨: {free}개 사용"}
        if lang == "ko" else {})
    try:
        monkeypatch.setenv("COURSE_LANG", "en")
        assert "kept busy" in hardware.use_threads().reason
        monkeypatch.setenv("COURSE_LANG", "ko")
        kept = hardware.use_threads()                 # read back from the store
        assert kept.threads == 1 and "chosen on" in kept.reason      # the stored choice
        assert "다른 프로세스로 바쁨" in kept.reason and "kept busy" not in kept.reason
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


def test_a_korean_report_keeps_its_colons_in_one_column(monkeypatch):
    """Issue 28: the report's labels are Korean, padded by display width (a Hangul character
    takes two columns), so every value starts in the same column as in English."""
    import unicodedata
    fake_cuda(monkeypatch, "Tesla T4", (7, 5), 15)
    hw = hardware.detect("cuda")
    monkeypatch.setenv("COURSE_LANG", "ko")
    lines = hardware.report(hw, {"fp32": 1.0, "bf16": 2.1, "fp16": 0.5}).splitlines()

    def colon_column(line):
        head = line.split(": ", 1)[0]
        return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in head)
    assert {colon_column(line) for line in lines} == {14}
    assert lines[0].startswith("장치") and any(line.startswith("레시피") for line in lines)
    assert "fp16 + GradScaler" in "\n".join(lines) and "손실 스케일링" in lines[-1]
