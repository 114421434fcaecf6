"""What this machine can do for mixed precision: device, bf16/fp16 support, memory.

`detect()` reads the hardware once and returns a `HardwareInfo`; `recommend_precision()` turns
it into the recipe the course uses on that machine, with the reason in words.

Facts this module relies on (see shared/notes/measurement.md):

* `torch.cuda.is_bf16_supported()` returns True on a T4 (compute capability 7.5), where bf16 is
  emulated and slow; native bf16 needs compute capability >= 8.0 (Ampere). We use
  `is_bf16_supported(including_emulation=False)` where it exists, else the capability.
* fp16 tensor cores arrived with Volta (compute capability 7.0).
* On a CPU, bf16 autocast is faster than fp32 only with `avx512_bf16` or AMX (`amx_bf16`);
  on plain AVX-512 it measured ~0.46x fp32 speed, on AVX2 ~0.03x. fp16 matmul on a CPU
  without `avx512_fp16`/`amx_fp16` is ~200x slower than fp32.
"""
from __future__ import annotations

import dataclasses
import platform
from dataclasses import dataclass, field

import torch

__all__ = ["HardwareInfo", "Recommendation", "detect", "recommend_precision", "report"]


@dataclass(frozen=True)
class HardwareInfo:
    """The facts about one device that decide the mixed-precision recipe.

    Attributes:
        device: ``"cuda"``, ``"mps"`` or ``"cpu"``.
        name: the GPU's name (``"Tesla T4"``) or the CPU's.
        compute_capability: CUDA (major, minor), ``None`` off CUDA.
        native_bf16: bf16 arithmetic runs in hardware (not emulated).
        fp16_fast: fp16 matmuls are fast (tensor cores on CUDA; avx512_fp16/AMX-FP16 on a CPU).
        total_memory_bytes: device memory in bytes (GPU memory, or ``None`` for CPU/MPS
            where the course does not read it).
        cpu_features: the CPU's ISA flags from ``torch.cpu.get_capabilities()`` that matter here
            (``avx2``, ``avx512_f``, ``avx512_bf16``, ``amx_bf16``, ``avx512_fp16``, ``amx_fp16``).
        torch_version: ``torch.__version__``.
        bf16_emulated: the device accepts bf16 but only by emulation (e.g. a T4).
    """

    device: str
    name: str
    compute_capability: tuple[int, int] | None = None
    native_bf16: bool = False
    fp16_fast: bool = False
    total_memory_bytes: int | None = None
    cpu_features: dict = field(default_factory=dict)
    torch_version: str = torch.__version__
    bf16_emulated: bool = False

    def as_dict(self) -> dict:
        """A plain dict (JSON-ready) of all fields."""
        d = dataclasses.asdict(self)
        d["compute_capability"] = list(self.compute_capability) if self.compute_capability else None
        return d


@dataclass(frozen=True)
class Recommendation:
    """The precision recipe for a device.

    Attributes:
        precision: ``"bf16"``, ``"fp16"`` or ``"fp32"``.
        grad_scaler: whether the recipe needs ``torch.amp.GradScaler`` (only fp16 does).
        reason: one or two sentences saying why, naming the hardware fact behind it.
    """

    precision: str
    grad_scaler: bool
    reason: str


_CPU_FLAGS = ("avx2", "avx512_f", "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16")


def _cpu_features() -> dict:
    caps = {}
    get = getattr(getattr(torch, "cpu", None), "get_capabilities", None)
    if get is not None:
        try:
            caps = dict(get())
        except Exception:  # pragma: no cover - depends on the build
            caps = {}
    return {k: bool(caps.get(k, False)) for k in _CPU_FLAGS}


def _cpu_name() -> str:
    get = getattr(getattr(torch, "cpu", None), "get_capabilities", None)
    if get is not None:
        try:
            name = get().get("cpu_name")
            if name:
                return str(name)
        except Exception:  # pragma: no cover
            pass
    return platform.processor() or platform.machine() or "CPU"


def _cuda_native_bf16(index: int, cc: tuple[int, int]) -> bool:
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # older torch without the keyword
        return cc >= (8, 0)


def detect(device: str | None = None) -> HardwareInfo:
    """Read the hardware of ``device`` (default: CUDA if available, else MPS, else CPU).

    Args:
        device: ``"cuda"``, ``"cuda:N"``, ``"mps"``, ``"cpu"`` or ``None`` for automatic.

    Returns:
        HardwareInfo for that device.

    Raises:
        ValueError: an unknown device string, or a device this machine does not have.
    """
    if device is None:
        if torch.cuda.is_available():
            device = "cuda"
        elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            device = "mps"
        else:
            device = "cpu"
    kind, _, idx = str(device).partition(":")
    cpu = _cpu_features()
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' requested but torch.cuda.is_available() is False "
                             "on this machine; use device='cpu'.")
        index = int(idx) if idx else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        cc = tuple(torch.cuda.get_device_capability(index))
        native = _cuda_native_bf16(index, cc)
        try:
            accepts_bf16 = bool(torch.cuda.is_bf16_supported())
        except Exception:  # pragma: no cover
            accepts_bf16 = native
        return HardwareInfo(
            device="cuda", name=str(props.name), compute_capability=cc,
            native_bf16=native, fp16_fast=cc >= (7, 0),
            total_memory_bytes=int(props.total_memory), cpu_features=cpu,
            bf16_emulated=accepts_bf16 and not native)
    if kind == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise ValueError("device 'mps' requested but torch.backends.mps.is_available() is False.")
        # Apple GPUs from M2 on run bf16; torch reports it through the MPS backend.
        return HardwareInfo(device="mps", name="Apple MPS", native_bf16=True, fp16_fast=True,
                            cpu_features=cpu)
    if kind == "cpu":
        return HardwareInfo(
            device="cpu", name=_cpu_name(),
            native_bf16=cpu["avx512_bf16"] or cpu["amx_bf16"],
            fp16_fast=cpu["avx512_fp16"] or cpu["amx_fp16"],
            cpu_features=cpu)
    raise ValueError(f"unknown device {device!r}: expected 'cuda', 'cuda:N', 'mps' or 'cpu'.")


def recommend_precision(hw: HardwareInfo | None = None) -> Recommendation:
    """The mixed-precision recipe for ``hw`` (default: ``detect()``), with the reason.

    Rules (PyTorch AMP docs; NVIDIA mixed-precision guide; shared/notes/measurement.md):

    * CUDA with compute capability >= 8.0 (Ampere, Ada, Hopper): bf16 autocast, no scaler.
    * CUDA 7.x (V100, T4): fp16 autocast + GradScaler; bf16 would be emulated.
    * older CUDA: fp32 (no fp16 tensor cores).
    * MPS: bf16 autocast (best effort).
    * CPU with avx512_bf16 or AMX: bf16 autocast; otherwise fp32, because bf16 runs slower
      than fp32 there and fp16 ~200x slower.
    """
    hw = hw or detect()
    if hw.device == "cuda":
        cc = hw.compute_capability or (0, 0)
        ccs = f"{cc[0]}.{cc[1]}"
        if hw.native_bf16:
            return Recommendation("bf16", False,
                                  f"{hw.name} (compute capability {ccs}) runs bf16 natively: bf16 "
                                  "has fp32's exponent range, so no loss scaling is needed.")
        if hw.fp16_fast:
            extra = (" torch.cuda.is_bf16_supported() says True here, but only because bf16 is "
                     "emulated." if hw.bf16_emulated else "")
            return Recommendation("fp16", True,
                                  f"{hw.name} (compute capability {ccs}) has fp16 tensor cores but "
                                  "no native bf16: use fp16 autocast with GradScaler (loss scaling "
                                  "keeps small gradients from flushing to zero)." + extra)
        return Recommendation("fp32", False,
                              f"{hw.name} (compute capability {ccs}) has no fp16 tensor cores: "
                              "mixed precision would not pay off.")
    if hw.device == "mps":
        return Recommendation("bf16", False, "Apple GPUs (MPS) run bf16 autocast; no loss "
                              "scaling is needed (best effort: MPS reports no peak memory).")
    f = hw.cpu_features
    if f.get("amx_bf16") or f.get("avx512_bf16"):
        isa = "AMX" if f.get("amx_bf16") else "AVX-512 BF16"
        return Recommendation("bf16", False, f"this CPU ({hw.name}) has {isa} instructions, so bf16 "
                              "matmuls run natively and faster than fp32.")
    isa = "AVX-512" if f.get("avx512_f") else ("AVX2" if f.get("avx2") else "no AVX-512/AVX2")
    return Recommendation("fp32", False, f"this CPU ({hw.name}, {isa}) has no bf16 instructions: "
                          "bf16 autocast is emulated and runs slower than fp32 (measured ~0.46x on "
                          "AVX-512, ~0.03x on AVX2), and fp16 ~200x slower. Stay in fp32 here; the "
                          "lessons still measure bf16's memory effect, which holds everywhere.")


def report(hw: HardwareInfo | None = None) -> str:
    """A few lines describing ``hw`` and its recommended recipe, for notebooks and the CLI."""
    hw = hw or detect()
    rec = recommend_precision(hw)
    lines = [f"device        : {hw.device} ({hw.name})"]
    if hw.compute_capability:
        lines.append(f"compute cap.  : {hw.compute_capability[0]}.{hw.compute_capability[1]}")
    if hw.total_memory_bytes:
        lines.append(f"memory        : {hw.total_memory_bytes / 2**30:.1f} GiB")
    lines.append(f"native bf16   : {hw.native_bf16}" + ("  (bf16 accepted but emulated)"
                                                         if hw.bf16_emulated else ""))
    lines.append(f"fast fp16     : {hw.fp16_fast}")
    flags = [k for k, v in hw.cpu_features.items() if v]
    lines.append(f"CPU ISA flags : {', '.join(flags) or 'none of ' + ', '.join(_CPU_FLAGS)}")
    lines.append(f"torch         : {hw.torch_version}")
    lines.append(f"recipe        : {rec.precision}" + (" + GradScaler" if rec.grad_scaler else ""))
    lines.append(f"why           : {rec.reason}")
    return "\n".join(lines)
