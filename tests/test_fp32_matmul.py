"""course_utils.fp32_matmul: which fp32 a matmul is, read and set through the one API this torch
has (torch >= 2.9: per-backend ``fp32_precision``; older: ``set_float32_matmul_precision``), the
settings restored after, and the old route testable on a new torch by a monkeypatched check."""
import pytest
import torch

from course_utils import fp32_matmul
from course_utils.fp32_matmul import (
    FP32_MATMUL_MODES,
    fp32_matmul_precision,
    fp32_matmul_probe,
    fp32_matmul_settings,
    tf32_probe,
)
from course_utils.hardware import detect

KEYS = {"api", "cuda matmul", "cpu matmul (oneDNN)", "cudnn conv"}


def _modes(settings):
    return {k: v for k, v in settings.items() if k != "api"}


def test_the_settings_read_pytorch_defaults_and_a_block_sets_and_restores_them():
    before = fp32_matmul_settings()
    assert set(before) == KEYS
    assert before["cuda matmul"] == "ieee" and before["cpu matmul (oneDNN)"] == "ieee"
    with fp32_matmul_precision("mkldnn", "bf16"):
        assert fp32_matmul_settings()["cpu matmul (oneDNN)"] == "bf16"
    with fp32_matmul_precision("cuda", "tf32"):
        assert fp32_matmul_settings()["cuda matmul"] == "tf32"
    assert fp32_matmul_settings() == before


@pytest.mark.skipif(not fp32_matmul.fp32_precision_api(), reason="torch < 2.9: no new API")
def test_the_new_api_is_the_route_on_this_torch_and_mixing_would_raise():
    """Why one route: after the new setting, torch's old getter raises ('mix of the legacy and new
    APIs'); the block restores the setting, after which it reads again."""
    assert fp32_matmul_settings()["api"] == "fp32_precision"
    with fp32_matmul_precision("mkldnn", "bf16"):
        assert torch.backends.mkldnn.matmul.fp32_precision == "bf16"
        with pytest.raises(RuntimeError, match="legacy and new"):
            torch.get_float32_matmul_precision()
    assert torch.get_float32_matmul_precision() == "highest"


def test_the_old_route_sets_float32_matmul_precision(monkeypatch):
    """torch 2.7-2.8 (monkeypatched here): 'high' allows TF32 on CUDA, 'medium' lets oneDNN use
    bf16; the settings are read from the old getters; the state is restored after."""
    monkeypatch.setattr(fp32_matmul, "fp32_precision_api", lambda: False)
    assert fp32_matmul_settings()["api"] == "set_float32_matmul_precision"
    with fp32_matmul_precision("mkldnn", "bf16"):
        assert torch.get_float32_matmul_precision() == "medium"
        assert fp32_matmul_settings()["cpu matmul (oneDNN)"] == "bf16"
    with fp32_matmul_precision("cuda", "tf32"):
        assert torch.get_float32_matmul_precision() == "high"
        assert torch.backends.cuda.matmul.allow_tf32
        assert fp32_matmul_settings()["cuda matmul"] == "tf32"
    assert torch.get_float32_matmul_precision() == "highest"
    assert _modes(fp32_matmul_settings()) == {"cuda matmul": "ieee", "cpu matmul (oneDNN)": "ieee",
                                              "cudnn conv": "tf32"}


def test_a_mode_a_backend_does_not_take_is_refused_in_words():
    with pytest.raises(ValueError, match="mode 'bf16'"):
        with fp32_matmul_precision("cuda", "bf16"):
            pass
    with pytest.raises(ValueError, match="backend 'mps'"):
        with fp32_matmul_precision("mps", "ieee"):
            pass
    assert "ieee" in FP32_MATMUL_MODES["cuda"] and "bf16" in FP32_MATMUL_MODES["mkldnn"]


def test_the_probe_measures_both_modes_on_a_bf16_cpu_and_plans_a_stand_in_by_its_capability(
        monkeypatch):
    if detect("cpu").native_bf16:
        df = fp32_matmul_probe("cpu", n=64, budget_s=0.01)
        assert list(df.index) == ["ieee", "bf16"] and (df["seconds"] > 0).all()
        assert df.loc["ieee", "error vs ieee"] == 1.0
        assert 0 < df.loc["ieee", "error"] < 1e-5          # full fp32 against fp64
        assert fp32_matmul_settings()["cpu matmul (oneDNN)"] == "ieee"   # restored
    else:   # oneDNN ignores the bf16 mode without bf16 instructions: nothing to compare
        assert fp32_matmul_probe("cpu", n=64, budget_s=0.01) is None
    # a CPU capped to AVX2 (as an AVX2-only laptop is) has no fast mode
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert fp32_matmul._reduced_modes(torch.device("cpu"), None) is None
    # a GPU plans by the capability it is given: a T4 stand-in on a bigger GPU has no TF32
    assert fp32_matmul._reduced_modes(torch.device("cuda"), (7, 5)) is None
    assert fp32_matmul._reduced_modes(torch.device("cuda"), (9, 0)) == ("cuda", ("ieee", "tf32"))
    assert tf32_probe("cpu") is None
    with pytest.raises(ValueError):
        tf32_probe("cpu", n=0)
    with pytest.raises(ValueError):
        fp32_matmul_probe("cpu", budget_s=0)
