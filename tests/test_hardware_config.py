"""Hardware detection (mocked GPUs and CPUs) and RunConfig validation."""
from types import SimpleNamespace

import pytest
import torch

from course_utils import config as cfgmod
from course_utils import hardware
from course_utils.config import RunConfig, check_feasible, config_for, size_profile


def fake_cuda(monkeypatch, name, cc, mem_gib):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(name=name, total_memory=int(mem_gib * 2**30)))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: cc)

    def is_bf16_supported(including_emulation=True):
        # What torch reports: True on a T4 when emulation counts (shared/notes/measurement.md).
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
    assert "emulated" in hardware.recommend_precision(hw).reason
    with pytest.raises(ValueError, match="emulated"):
        check_feasible(RunConfig(device="cuda", precision="bf16"), hw)


def fake_cpu(monkeypatch, **flags):
    caps = {"cpu_name": "Test CPU", "avx2": True, **flags}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)


@pytest.mark.parametrize("flags,precision,words", [
    ({"avx512_f": True, "avx512_bf16": True}, "bf16", "AVX-512 BF16"),
    ({"avx512_f": True, "amx_bf16": True}, "bf16", "AMX"),
    ({"avx512_f": True}, "fp32", "slower than fp32"),
    ({}, "fp32", "AVX2"),
])
def test_cpu_recommendation(monkeypatch, flags, precision, words):
    fake_cpu(monkeypatch, **flags)
    hw = hardware.detect("cpu")
    rec = hardware.recommend_precision(hw)
    assert rec.precision == precision and not rec.grad_scaler
    assert words in rec.reason
    assert "Test CPU" in hardware.report(hw)


def test_cpu_without_bf16_warns_but_runs(monkeypatch):
    fake_cpu(monkeypatch, avx512_f=True)
    notes = check_feasible(RunConfig(precision="bf16"), hardware.detect("cpu"))
    assert any("slower than fp32" in n for n in notes)


def test_fp16_on_cpu_refused_unless_tiny(monkeypatch):
    fake_cpu(monkeypatch, avx512_f=True, avx512_bf16=True)
    hw = hardware.detect("cpu")
    with pytest.raises(ValueError, match="200x slower"):
        check_feasible(config_for("cpu", device="cpu", precision="fp16"), hw)
    assert check_feasible(config_for("cpu", device="cpu", precision="fp16"), hw, force=True)
    check_feasible(config_for("smoke", device="cpu", precision="fp16"), hw)  # tiny: allowed


def test_missing_cuda_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="cuda"):
        hardware.detect("cuda")
    with pytest.raises(ValueError, match="unknown device"):
        hardware.detect("tpu")


@pytest.mark.parametrize("kw,match", [
    ({"precision": "fp8"}, "unknown precision"),
    ({"batch_size": 0}, "batch_size must be a positive integer"),
    ({"seq_len": -1}, "seq_len"),
    ({"d_model": 100, "n_heads": 3}, "divisible"),
    ({"checkpoint": "sometimes"}, "unknown policy"),
    ({"checkpoint": "every-9", "n_layers": 4}, "outside 1..4"),
    ({"checkpoint": "segments:0"}, "outside"),
    ({"attention": "flash3"}, "unknown attention"),
    ({"device": "tpu"}, "unknown device"),
    ({"grad_accum_steps": 0}, "grad_accum_steps"),
])
def test_config_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        RunConfig(**kw)


def test_policy_error_names_the_valid_ones():
    with pytest.raises(ValueError) as e:
        RunConfig(checkpoint="half")
    for name in ("none", "full", "every-K", "segments:N", "selective"):
        assert name in str(e.value)


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
    c = RunConfig(precision="bf16", checkpoint="full", grad_accum_steps=2, batch_size=3,
                  seq_len=5)
    assert c.label == "bf16+full+accum2"
    assert c.tokens_per_step == 30
