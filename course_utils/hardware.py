"""What this machine can do for mixed precision, and the recipe the course trains in on it (every
lesson and the CLI). The run guard lives in `course_utils.guard`.

Facts relied on (PyTorch and oneDNN docs): ``torch.cuda.is_bf16_supported()`` is True on a T4,
which emulates bf16; fp16 tensor cores arrived with Volta (compute capability 7.0); a CPU runs
bf16 natively only with ``avx512_bf16`` or ``amx_bf16``, fp16 only with ``avx512_fp16`` or
``amx_fp16``; ``ONEDNN_MAX_CPU_ISA`` ("CPU Dispatcher Control") and ``ATEN_CPU_CAPABILITY`` cap them.

Over 400 lines because every fact here is read from one `HardwareInfo`: detection, the ISA caps,
the recipe, emulation, the threads, the matmul probe and the report must agree.
"""
from __future__ import annotations

import dataclasses
import os
import platform
import time
import unicodedata
from dataclasses import dataclass, field

import torch
from torch.utils import benchmark

from . import stand_in, store
from .i18n import tr
from .step_timing import emulated_factor
from .terms import DEVICE_KINDS, PRECISION_DTYPES, GiB, autocast_dtype, default_device, device_kind

__all__ = ["HardwareInfo", "Recommendation", "ThreadChoice", "MPS_PEAK_NOTE", "detect",
           "recommend_precision", "is_emulated", "require_device", "memory_device",
           "usable_cores", "use_threads", "matmul_probe", "report"]

#: What the course says wherever MPS's peak memory is measured on the CPU instead.
MPS_PEAK_NOTE = ("MPS has no peak-memory counter: the peak is measured by one step of the same "
                 "model, batch and precision on the CPU (its kernels may allocate a little "
                 "differently); times and everything else stay measured on MPS.")


@dataclass(frozen=True)
class HardwareInfo:
    """The facts about one device that decide the mixed-precision recipe: ``device`` (``"cuda"``,
    ``"mps"``, ``"cpu"``), its ``name``, CUDA's ``compute_capability`` (None elsewhere),
    ``native_bf16`` (in hardware) or ``bf16_emulated`` (accepted but emulated: a T4, most CPUs),
    ``fp16_fast`` (fp16 tensor cores; avx512_fp16/AMX-FP16), ``total_memory_bytes`` (GPU only),
    ``cpu_features`` (`_CPU_FLAGS`, False above the ``isa_cap`` in force, e.g.
    ``"ONEDNN_MAX_CPU_ISA=AVX2"``) and ``stand_in`` ("" or the words saying a bigger GPU plans as
    a smaller one, `course_utils.stand_in`; the other fields are then the smaller card's)."""

    device: str
    name: str
    compute_capability: tuple[int, int] | None = None
    native_bf16: bool = False
    fp16_fast: bool = False
    total_memory_bytes: int | None = None
    cpu_features: dict = field(default_factory=dict)
    isa_cap: str = ""
    torch_version: str = torch.__version__
    bf16_emulated: bool = False
    stand_in: str = ""

    def as_dict(self) -> dict:
        """A plain dict (JSON-ready) of all fields."""
        d = dataclasses.asdict(self)
        d["compute_capability"] = list(self.compute_capability) if self.compute_capability else None
        return d


@dataclass(frozen=True)
class Recommendation:
    """The precision recipe for a device: ``precision`` to train in (``"bf16"``, ``"fp16"``,
    ``"fp32"``), whether it needs ``grad_scaler`` (fp16 only), the ``reason`` (the hardware fact
    behind it) and ``low``, the low precision the lessons compare with fp32 here (``"fp16"`` on a
    GPU without native bf16, else ``"bf16"``; it may be emulated)."""

    precision: str
    grad_scaler: bool
    reason: str
    low: str = "bf16"


#: A cgroup v2 CPU quota (``"200000 100000"``: two CPUs' worth; ``"max 100000"``: none).
CPU_QUOTA = "/sys/fs/cgroup/cpu.max"

_CPU_FLAGS = ("avx2", "avx512_f", "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16")

# oneDNN's ISA levels in order ("CPU Dispatcher Control"); a flag is usable under a cap at or
# above the level that introduced it.
_ONEDNN_LEVELS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE",
                  "AVX512_CORE_VNNI", "AVX512_CORE_BF16", "AVX512_CORE_FP16",
                  "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16")
_ONEDNN_ALIASES = {"AVX10_1_512": "AVX512_CORE_FP16", "AVX10_1_512_AMX": "AVX512_CORE_AMX",
                   "AVX10_1_512_AMX_FP16": "AVX512_CORE_AMX_FP16"}
_FLAG_LEVEL = {"avx2": "AVX2", "avx512_f": "AVX512_CORE", "avx512_bf16": "AVX512_CORE_BF16",
               "avx512_fp16": "AVX512_CORE_FP16", "amx_bf16": "AVX512_CORE_AMX",
               "amx_fp16": "AVX512_CORE_AMX_FP16"}
# ATEN_CPU_CAPABILITY values and the widest vector ISA they allow.
_ATEN_LEVEL = {"default": "SSE41", "avx2": "AVX2", "avx512": "AVX512_CORE_AMX_FP16"}


def _cpu_features() -> tuple[dict, str]:
    """`_CPU_FLAGS` as torch's kernels may use them under the environment's ISA caps, and the
    caps in words."""
    caps, words = [], []
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    onednn = _ONEDNN_ALIASES.get(onednn, onednn)
    if onednn in _ONEDNN_LEVELS:
        caps.append(onednn)
        words.append(f"ONEDNN_MAX_CPU_ISA={os.environ['ONEDNN_MAX_CPU_ISA'].strip()}")
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if aten in _ATEN_LEVEL:
        caps.append(_ATEN_LEVEL[aten])
        words.append(f"ATEN_CPU_CAPABILITY={aten}")
    top = min(map(_ONEDNN_LEVELS.index, caps)) if caps else len(_ONEDNN_LEVELS)
    have = _capabilities()
    return {k: bool(have.get(k, False)) and _ONEDNN_LEVELS.index(_FLAG_LEVEL[k]) <= top
            for k in _CPU_FLAGS}, " ".join(words)


def _capabilities() -> dict:
    get = getattr(getattr(torch, "cpu", None), "get_capabilities", None)
    try:
        return dict(get()) if get is not None else {}
    except Exception:  # pragma: no cover - depends on the build
        return {}


def _cpu_name() -> str:
    name = _capabilities().get("cpu_name")
    return str(name) if name else (platform.processor() or platform.machine() or "CPU")


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return mps is not None and mps.is_available()


def require_device(device: str) -> None:
    """Check that ``device`` exists on this machine.

    Raises:
        ValueError: a device string torch does not know, or one this machine lacks.
    """
    kind = device_kind(device)
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(tr("device {device!r} requested but this machine has no CUDA GPU "
                                "(torch.cuda.is_available() is False); use device='cpu'.",
                                device=device))
        index = torch.device(device).index
        if index is not None and index >= torch.cuda.device_count():
            raise ValueError(tr("device {device!r} requested but this machine has {n} CUDA "
                                "device(s).", device=device, n=torch.cuda.device_count()))
    elif kind == "mps" and not _mps_available():
        raise ValueError(tr("device {device!r} requested but MPS is not available here; use "
                            "device='cpu'.", device=device))
    elif kind not in DEVICE_KINDS:
        raise ValueError(tr("unknown device {device!r}: expected 'cpu', 'cuda', 'cuda:N' or "
                            "'mps'.", device=device))


def memory_device(device: str | None = None) -> str:
    """The device on which peak memory can be measured: ``device`` (default `default_device`),
    but ``"cpu"`` for MPS, whose ``torch.mps`` has no peak counter (`MPS_PEAK_NOTE`).

    Raises:
        ValueError: a string that names no device torch knows.
    """
    device = device or default_device()
    return "cpu" if device_kind(device) == "mps" else device


def detect(device: str | None = None) -> HardwareInfo:
    """Read the hardware of ``device`` (default: CUDA if available, else MPS, else CPU).

    Raises:
        ValueError: an unknown device string, or a device this machine does not have.
    """
    device = device or default_device()
    require_device(device)
    kind = torch.device(device).type
    cpu, cap = _cpu_features()
    if kind == "cuda":
        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
        props = torch.cuda.get_device_properties(index)
        card = stand_in.active()
        if card is not None:
            stand_in.apply_memory_cap(index)
            return HardwareInfo(device="cuda", name=f"{props.name} as a {card.name}",
                                compute_capability=card.compute_capability, native_bf16=False,
                                fp16_fast=True, total_memory_bytes=stand_in.cap_bytes(index),
                                cpu_features=cpu, isa_cap=cap, bf16_emulated=True,
                                stand_in=stand_in.describe(props.name, card))
        cc = tuple(torch.cuda.get_device_capability(index))
        try:
            native = bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # older torch without the keyword
            native = cc >= (8, 0)
        try:
            accepts_bf16 = bool(torch.cuda.is_bf16_supported())
        except Exception:  # pragma: no cover
            accepts_bf16 = native
        return HardwareInfo(device="cuda", name=str(props.name), compute_capability=cc,
                            native_bf16=native, fp16_fast=cc >= (7, 0),
                            total_memory_bytes=int(props.total_memory), cpu_features=cpu,
                            isa_cap=cap, bf16_emulated=accepts_bf16 and not native)
    if kind == "mps":
        # Apple GPUs from M2 on run bf16; torch reports it through the MPS backend.
        return HardwareInfo(device="mps", name="Apple MPS", native_bf16=True, fp16_fast=True,
                            cpu_features=cpu, isa_cap=cap)
    native = cpu["avx512_bf16"] or cpu["amx_bf16"]
    return HardwareInfo(device="cpu", name=_cpu_name(), native_bf16=native,
                        fp16_fast=cpu["avx512_fp16"] or cpu["amx_fp16"], cpu_features=cpu,
                        isa_cap=cap, bf16_emulated=not native)


def is_emulated(hw: HardwareInfo, precision: str) -> bool:
    """Whether ``precision`` runs only by emulation on ``hw`` (its step time then says nothing
    about hardware): bf16 without native bf16; fp16 on a CPU without fp16 instructions.

    Raises:
        ValueError: an unknown precision.
    """
    autocast_dtype(precision)
    return (precision == "bf16" and not hw.native_bf16) or (
        precision == "fp16" and hw.device == "cpu" and not hw.fp16_fast)


def recommend_precision(hw: HardwareInfo | None = None) -> Recommendation:
    """The mixed-precision recipe for ``hw`` (default: `detect()`), with the reason (PyTorch
    AMP docs; NVIDIA mixed-precision guide): bf16 where it is native (CUDA >= 8.0, MPS, a CPU with
    AVX-512 BF16 or AMX), fp16 + GradScaler on CUDA 7.x, else fp32."""
    hw = hw or detect()
    if hw.device == "cuda":
        cc = hw.compute_capability or (0, 0)
        ccs = f"{cc[0]}.{cc[1]}"
        if hw.native_bf16:
            return Recommendation("bf16", False, tr(
                "{name} (compute capability {cc}) runs bf16 natively: bf16 has fp32's exponent "
                "range, so no loss scaling is needed.", name=hw.name, cc=ccs))
        if hw.fp16_fast:
            return Recommendation("fp16", True, tr(
                "{name} (compute capability {cc}) has fp16 tensor cores but no native bf16: "
                "use fp16 autocast with GradScaler (loss scaling keeps small gradients from "
                "flushing to zero). torch.cuda.is_bf16_supported() says True here, but only "
                "because bf16 is emulated.", name=hw.name, cc=ccs) if hw.bf16_emulated else tr(
                "{name} (compute capability {cc}) has fp16 tensor cores but no native bf16: use "
                "fp16 autocast with GradScaler (loss scaling keeps small gradients from flushing "
                "to zero).", name=hw.name, cc=ccs), "fp16")
        return Recommendation("fp32", False, tr(
            "{name} (compute capability {cc}) has no fp16 tensor cores: mixed precision would "
            "not pay off.", name=hw.name, cc=ccs), "fp16")
    if hw.device == "mps":
        return Recommendation("bf16", False, tr("Apple GPUs (MPS) run bf16 autocast; no loss "
                                                "scaling is needed (best effort: MPS reports no "
                                                "peak memory)."))
    f = hw.cpu_features
    if f.get("amx_bf16") or f.get("avx512_bf16"):
        isa = "AMX" if f.get("amx_bf16") else "AVX-512 BF16"
        return Recommendation("bf16", False, tr("this CPU ({name}) has {isa} instructions, so "
                                                "bf16 matmuls run natively.", name=hw.name, isa=isa))
    isa = "AVX-512" if f.get("avx512_f") else ("AVX2" if f.get("avx2") else tr("no AVX-512/AVX2"))
    capped = tr(" (capped by {cap})", cap=hw.isa_cap) if hw.isa_cap else ""
    return Recommendation("fp32", False, tr(
        "this CPU ({name}, {isa}{capped}) has no bf16 instructions: bf16 autocast is emulated "
        "here, and fp16 too. Train in fp32 here; the lessons still measure bf16's saved-tensor "
        "bytes, which do not depend on how the arithmetic is done.", name=hw.name,
        isa=isa, capped=capped))


@dataclass(frozen=True)
class ThreadChoice:
    """How many intra-op threads torch uses, and why (`use_threads`)."""

    threads: int
    reason: str


def _cpu_busy(sample_s: float) -> float | None:
    """CPUs kept busy by other processes over ``sample_s`` seconds (``/proc/stat``; None off Linux)."""
    def read():
        with open("/proc/stat") as f:
            vals = [int(v) for v in f.readline().split()[1:]]
        return sum(vals), vals[3] + (vals[4] if len(vals) > 4 else 0)   # idle + iowait
    try:
        t0, i0 = read()
        time.sleep(sample_s)
        t1, i1 = read()
    except (OSError, ValueError, IndexError):
        return None
    total = t1 - t0
    return 0.0 if total <= 0 else (1 - (i1 - i0) / total) * (os.cpu_count() or 1)


def usable_cores() -> int:
    """CPU cores this process may keep busy, at least 1: the smallest of the CPU affinity
    (else ``os.cpu_count``), the physical cores torch reports and a cgroup v2 quota
    (`CPU_QUOTA`). `use_threads` and `course_utils.distributed.max_world_size` both follow it."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    physical = _capabilities().get("num_physical_cores")
    if isinstance(physical, int) and physical > 0:
        n = min(n, physical)
    try:  # a cgroup (v2) CPU quota, as in containers: "max 100000" or "200000 100000"
        with open(CPU_QUOTA) as f:
            quota, period = f.read().split()
        if quota != "max":
            n = min(n, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)


def use_threads(sample_s: float = 0.2, fresh: bool = False) -> ThreadChoice:
    """Set torch's intra-op threads, the same in every lesson, and return the `ThreadChoice`:
    ``OMP_NUM_THREADS`` if set; in a notebook, the count the first lesson chose on this machine
    (from the results store); else (or with ``fresh``) `usable_cores` minus the CPUs other
    processes kept busy over ``sample_s`` seconds, at least 1 (on a 2-core CPU beside a busy
    2-thread process a small step took 11.5 ms with 1 thread but 343 ms with 2)."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        torch.set_num_threads(int(env))
        return ThreadChoice(int(env), f"OMP_NUM_THREADS={env}")
    keep = store.in_notebook()
    key = store.context_key(size="any", hw=detect("cpu")) if keep else None
    cores = usable_cores()
    if keep and not fresh:
        rec = store.lookup("protocol", "threads", key)
        if (rec and isinstance(rec.get("threads"), int) and 1 <= rec["threads"] <= cores
                and isinstance(rec.get("cores"), int)):
            torch.set_num_threads(rec["threads"])
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(rec.get("recorded_at", 0)))
            why = _threads_reason(rec["cores"], rec.get("busy"), rec["threads"])
            return ThreadChoice(rec["threads"], tr(
                "{reason}; chosen on {when} and kept for every lesson on this machine "
                "(use_threads(fresh=True) chooses again)", reason=why, when=when))
    busy = _cpu_busy(sample_s)
    free = cores if busy is None else max(1, min(cores, round(cores - busy + 0.25)))
    torch.set_num_threads(free)
    if keep:
        store.record("protocol", "threads", {"threads": free, "cores": cores, "busy": busy}, key)
    return ThreadChoice(free, _threads_reason(cores, busy, free))


def _threads_reason(cores: int, busy: float | None, free: int) -> str:
    """Why `use_threads` chose ``free`` of ``cores`` threads, in the learner's language."""
    if busy is None:
        return tr("{cores} usable core(s)", cores=cores)
    return (tr("{cores} usable core(s), {busy:.1f} kept busy by other processes: using {free}",
               cores=cores, busy=busy, free=free)
            if free < cores else tr("{cores} usable core(s), all free", cores=cores))


def matmul_probe(device: str = "cpu", n: int = 256, budget_s: float = 0.2) -> dict:
    """``{"fp32": s, "bf16": s, "fp16": s}``: seconds of one ``(n x n) @ (n x n)`` matmul on
    ``device``, the median of ``Timer.blocked_autorange(min_run_time=budget_s)``.

    Raises:
        ValueError: a device this machine lacks, or ``n`` / ``budget_s`` not positive.
    """
    require_device(device)
    if n < 1 or budget_s <= 0:
        raise ValueError(tr("n and budget_s must be positive, got {n} and {budget_s}.", n=n,
                            budget_s=budget_s))
    out = {}
    for name, dtype in PRECISION_DTYPES.items():
        a = torch.randn(n, n, device=device).to(dtype)
        timer = benchmark.Timer("a @ a", globals={"a": a}, num_threads=torch.get_num_threads())
        out[name] = float(timer.blocked_autorange(min_run_time=budget_s).median)
    return out


def _ratio_text(r: float) -> str:
    """``1.18x``, ``0.44x``; two significant figures below 0.1 (``0.0041x``, never ``0.00x``)."""
    return f"{r:.2f}x" if r >= 0.1 else f"{r:.2g}x"


def _fp16_words(hw: HardwareInfo) -> str:
    """Whether ``hw`` has fp16 arithmetic in hardware, and which feature says so."""
    if hw.device == "cpu":
        isa = [f for f in ("avx512_fp16", "amx_fp16") if hw.cpu_features.get(f)]
        return tr("yes ({isa})", isa=", ".join(isa)) if isa else tr("no (emulated)")
    if hw.device == "cuda":
        return tr("yes (fp16 tensor cores)") if hw.fp16_fast else tr("no (no fp16 tensor cores)")
    return tr("yes") if hw.fp16_fast else tr("no")


def _line(label: str, value: str) -> str:
    """``"device        : cpu (...)"``: the label padded to 14 columns (a Hangul character: 2)."""
    width = sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in label)
    return f"{label}{' ' * max(1, 14 - width)}: {value}"


def _probe_words(hw: HardwareInfo, probe: dict) -> str:
    """The measured matmul ratios (an emulated format's rounded, `emulated_factor`)."""
    parts = [tr("{precision} about {factor} fp32's time (emulated)", precision=p,
                factor=emulated_factor(probe[p] / probe["fp32"]))
             if is_emulated(hw, p) and not hw.stand_in
             else tr("{precision} {ratio} fp32's time", precision=p,
                     ratio=_ratio_text(probe[p] / probe["fp32"]))
             for p in ("bf16", "fp16") if p in probe]
    return ", ".join(parts) + (tr(" (measured now, at the bigger GPU's speed)") if hw.stand_in
                               else tr(" (measured now)"))


def report(hw: HardwareInfo | None = None, probe: dict | None = None) -> str:
    """A few lines on ``hw``, its recipe and the threads in use, with the measured matmul ratios
    of ``probe`` (`matmul_probe`'s result) if given."""
    hw = hw or detect()
    rec = recommend_precision(hw)
    rows = [(tr("device"), f"{hw.device} ({hw.name})")]
    if hw.stand_in:
        rows.append((tr("stand-in"), hw.stand_in))
    if hw.compute_capability:
        rows.append((tr("compute cap."), f"{hw.compute_capability[0]}.{hw.compute_capability[1]}"))
    if hw.total_memory_bytes:
        digits = 2 if hw.stand_in else 1   # the stand-in's 14.75 GiB, as its sentence says it
        rows.append((tr("memory"), f"{hw.total_memory_bytes / GiB:.{digits}f} GiB"))
    rows.append((tr("native bf16"), tr("{native}  (bf16 accepted but emulated)", native=hw.native_bf16)
                 if hw.bf16_emulated else f"{hw.native_bf16}"))
    rows.append((tr("native fp16"), _fp16_words(hw)))
    flags = ", ".join(k for k, v in hw.cpu_features.items() if v) \
        or tr("none of {flags}", flags=", ".join(_CPU_FLAGS))
    rows.append((tr("CPU ISA flags"), tr("{flags}  (capped by {cap})", flags=flags, cap=hw.isa_cap)
                 if hw.isa_cap else flags))
    rows.append((tr("CPU threads"), f"{torch.get_num_threads()}"))
    if hw.device == "mps":
        rows.append((tr("peak memory"), tr("measured on the CPU (MPS has no peak-memory counter)")))
    elif hw.device == "cpu" and _mps_available():
        rows.append(("MPS", tr("available, but it has no peak-memory counter: peak memory is "
                               "measured on the CPU")))
    rows.append(("torch", hw.torch_version))
    if probe:
        rows.append((tr("matmul here"), _probe_words(hw, probe)))
    rows.append((tr("recipe"), rec.precision + (" + GradScaler" if rec.grad_scaler else "")))
    rows.append((tr("why"), rec.reason))
    return "\n".join(_line(label, value) for label, value in rows)
