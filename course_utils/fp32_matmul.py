"""Which fp32 an fp32 matmul is: full fp32 ("ieee"), TF32 on NVIDIA Ampere and newer GPUs, bf16
through oneDNN on a CPU with bf16 instructions (lesson 01 §7, claim C1's baseline).

torch 2.9 and later set this per backend (``torch.backends.<backend>.matmul.fp32_precision``),
torch 2.7-2.8 only through ``torch.set_float32_matmul_precision`` and ``allow_tf32`` (PyTorch docs,
"CUDA semantics: TensorFloat-32 (TF32) on Ampere (and later) devices"). `fp32_precision_api`
picks the route; everything here reads and sets through it.
"""
from __future__ import annotations

import functools
from contextlib import contextmanager

import pandas as pd
import torch
from torch.utils import benchmark

from .hardware import detect, require_device
from .i18n import tr

__all__ = ["FP32_MATMUL_MODES", "fp32_precision_api", "fp32_matmul_settings",
           "fp32_matmul_precision", "fp32_matmul_probe", "tf32_probe"]

#: The modes an fp32 matmul may run in, per backend: ``"ieee"`` is full fp32; ``"tf32"`` rounds
#: the inputs to 10 mantissa bits; ``"bf16"`` lets oneDNN compute in bf16 (same PyTorch docs).
FP32_MATMUL_MODES = {"cuda": ("ieee", "tf32"), "mkldnn": ("ieee", "tf32", "bf16")}

#: The same modes as ``torch.set_float32_matmul_precision`` names them (torch 2.7-2.8; "medium":
#: ``use_mkldnn_bf32_matmul`` in ``aten/src/ATen/native/mkldnn/Matmul.cpp``).
_LEGACY_PRECISION = {"ieee": "highest", "tf32": "high", "bf16": "medium"}


def fp32_precision_api() -> bool:
    """True where torch has the per-backend fp32 precision settings (torch 2.9 and later). Reading
    the old settings after the new ones were used raises a RuntimeError ("mix of the legacy and
    new APIs"): the course uses one API, the newest this torch has."""
    return hasattr(torch.backends, "fp32_precision")


def fp32_matmul_settings() -> dict:
    """What an fp32 matmul means in this process (`fp32_precision_api`'s route):
    ``{"api": "fp32_precision" or "set_float32_matmul_precision", "cuda matmul": mode,
    "cpu matmul (oneDNN)": mode, "cudnn conv": mode}``, each mode one of `FP32_MATMUL_MODES`; a
    setting left at ``"none"`` (never set) reads as ``"ieee"``."""
    if fp32_precision_api():
        def mode(value):
            return "ieee" if value == "none" else value
        return {"api": "fp32_precision",
                "cuda matmul": mode(torch.backends.cuda.matmul.fp32_precision),
                "cpu matmul (oneDNN)": mode(torch.backends.mkldnn.matmul.fp32_precision),
                "cudnn conv": mode(torch.backends.cudnn.conv.fp32_precision)}
    precision = torch.get_float32_matmul_precision()
    return {"api": "set_float32_matmul_precision",
            "cuda matmul": "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee",
            "cpu matmul (oneDNN)": "bf16" if precision == "medium" else "ieee",
            "cudnn conv": "tf32" if torch.backends.cudnn.allow_tf32 else "ieee"}


@contextmanager
def fp32_matmul_precision(backend: str, mode: str):
    """Within the block, fp32 matmuls of ``backend`` (``"cuda"``, or ``"mkldnn"``: oneDNN on a
    CPU) may run in ``mode`` (`FP32_MATMUL_MODES`); the setting before is restored after.

    Raises:
        ValueError: an unknown backend, or a mode that backend does not take.
    """
    if mode not in FP32_MATMUL_MODES.get(backend, ()):
        raise ValueError(tr("fp32 matmul modes: {modes} (backend: its modes); got backend "
                            "{backend!r}, mode {mode!r}.", modes=FP32_MATMUL_MODES,
                            backend=backend, mode=mode))
    if fp32_precision_api():
        setting = getattr(torch.backends, backend).matmul
        restore = functools.partial(setattr, setting, "fp32_precision", setting.fp32_precision)
        setting.fp32_precision = mode
    else:
        restore = functools.partial(torch.set_float32_matmul_precision,
                                    torch.get_float32_matmul_precision())
        torch.set_float32_matmul_precision(_LEGACY_PRECISION[mode])
    try:
        yield
    finally:
        restore()


def _reduced_modes(dev: torch.device, capability) -> tuple[str, tuple[str, ...]] | None:
    """(backend, modes) a probe compares on ``dev``; None where fp32 matmuls have no faster mode."""
    if dev.type == "cpu":
        return ("mkldnn", ("ieee", "bf16")) if detect("cpu").native_bf16 else None
    if dev.type == "cuda":
        cc = capability if capability is not None else torch.cuda.get_device_capability(dev)
        return ("cuda", ("ieee", "tf32")) if tuple(cc) >= (8, 0) else None
    return None


def _check_probe_size(n: int, budget_s: float) -> None:
    if n < 1 or budget_s <= 0:
        raise ValueError(tr("n and budget_s must be positive, got {n} and {budget_s}.", n=n,
                            budget_s=budget_s))


def fp32_matmul_probe(device: str = "cuda", n: int = 2048, budget_s: float = 0.2,
                      capability=None) -> pd.DataFrame | None:
    """One ``(n x n) @ (n x n)`` fp32 matmul in full fp32 (``"ieee"``) and in the faster mode
    this device may use: ``"tf32"`` on an NVIDIA GPU of compute capability 8.0 or more,
    ``"bf16"`` (oneDNN) on a CPU with avx512_bf16 or AMX. Settings in force are restored after.
    ``capability`` plans for a stand-in GPU's (default: the device's own).

    Returns:
        One row per mode, indexed by it: ``seconds`` (median of ``Timer.blocked_autorange``,
        about ``budget_s`` each, no noise band), ``error`` (the largest absolute error against
        the fp64 product over that product's mean magnitude) and ``error vs ieee`` (over full
        fp32's). None where no faster mode exists (a CPU without bf16 instructions as oneDNN
        sees them, ``ONEDNN_MAX_CPU_ISA=AVX2`` included; MPS; a GPU older than Ampere).

    Raises:
        ValueError: a device this machine lacks, or ``n`` / ``budget_s`` not positive.
    """
    require_device(device)
    _check_probe_size(n, budget_s)
    dev = torch.device(device)
    plan = _reduced_modes(dev, capability)
    if plan is None:
        return None
    backend, modes = plan
    g = torch.Generator().manual_seed(0)
    a64 = torch.randn(n, n, generator=g, dtype=torch.float64).to(dev)
    b64 = torch.randn(n, n, generator=g, dtype=torch.float64).to(dev)
    exact = a64 @ b64  # fp64: no fp32 setting applies to it
    a, b = a64.float(), b64.float()
    rows = {}
    for mode in modes:
        with fp32_matmul_precision(backend, mode):
            timer = benchmark.Timer("a @ b", globals={"a": a, "b": b},
                                    num_threads=torch.get_num_threads())
            seconds = float(timer.blocked_autorange(min_run_time=budget_s).median)
            err = float(((a @ b).double() - exact).abs().max() / exact.abs().mean())
        rows[mode] = {"seconds": seconds, "error": err}
    df = pd.DataFrame.from_dict(rows, orient="index")
    df["error vs ieee"] = df["error"] / df.loc["ieee", "error"]
    df.index.name = f"fp32 matmul on {dev.type}"
    return df


def tf32_probe(device: str = "cuda", n: int = 2048, budget_s: float = 0.2,
               capability=None) -> dict | None:
    """`fp32_matmul_probe`'s two CUDA rows: ``{"fp32": s, "tf32": s}`` (seconds), or None where
    TF32 does not exist (a CPU, MPS, or a GPU older than Ampere).

    Raises:
        ValueError: a device this machine lacks, or ``n`` / ``budget_s`` not positive.
    """
    require_device(device)
    if torch.device(device).type != "cuda":
        _check_probe_size(n, budget_s)
        return None
    df = fp32_matmul_probe(device, n, budget_s, capability)
    return None if df is None else {"fp32": df.loc["ieee", "seconds"], "tf32": df.loc["tf32", "seconds"]}
