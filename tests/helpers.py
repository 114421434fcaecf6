"""What several test modules build the same way: fake hardware and machines, small models and
tables. ``from helpers import fake_cpu, ...`` (pytest puts ``tests/`` on ``sys.path``); the
fixtures of the same kind are in ``conftest.py``."""
from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from course_utils import evidence, guard, model_zoo
from course_utils.measure import Measurement, measure
from course_utils.training_arms import Arm, ArmHistory

#: The ledger's tiny model (`course_utils.evidence.small_config`): the `smoke` profile on the CPU.
TINY = evidence.small_config()


# ------------------------------------------------------------------ hardware and machines

def fake_cuda(monkeypatch, name, cc, mem_gib):
    """Make torch report one CUDA GPU ``name`` of compute capability ``cc`` and ``mem_gib`` GiB
    (90% free), with is_bf16_supported as torch answers on that capability."""
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


class FakeCuda:
    """A fake ``torch.cuda`` of ``count`` GPUs named ``name``, of compute capability ``cc`` and
    ``total`` bytes each, with a caching allocator's counters, strict where torch 2.11 is:

    * ``set_per_process_memory_fraction`` and ``mem_get_info`` refuse a device without an index
      (``"cuda"``) with torch's ValueError (torch 2.11 on the lent H100; 2.13 lets
      ``mem_get_info`` pass), and the fraction must be a float in [0, 1];
    * the other calls take None, an index, ``"cuda"`` or ``"cuda:N"`` and read the current device;
    * `allocate` reserves bytes as the caching allocator does: beyond the fraction's cap it
      raises ``torch.OutOfMemoryError`` with torch's message (c10's CUDACachingAllocator), which
      names the real GPU's capacity; ``empty_cache`` gives cached blocks back.

    ``others``: bytes that other processes hold (the driver's free memory leaves them out).
    """

    FUNCTIONS = ("is_available", "device_count", "current_device", "get_device_properties",
                 "get_device_capability", "is_bf16_supported", "mem_get_info",
                 "memory_reserved", "memory_allocated", "max_memory_allocated",
                 "max_memory_reserved", "reset_peak_memory_stats",
                 "set_per_process_memory_fraction", "synchronize", "empty_cache")

    def __init__(self, name="NVIDIA H200", cc=(9, 0), total=int(139.8 * 2**30), count=1,
                 others=0):
        self.name, self.cc, self.total, self.count, self.others = name, cc, total, count, others
        self.fraction = dict.fromkeys(range(count), 1.0)
        self.reserved, self.allocated = [0] * count, [0] * count
        self.peak = [0] * count
        self.calls = []  # (function, device index) of every call that names a device

    def install(self, monkeypatch):
        for fn in self.FUNCTIONS:
            monkeypatch.setattr(torch.cuda, fn, getattr(self, fn))
        return self

    def _index(self, device=None, strict=False) -> int:
        if device is None:
            return 0
        if isinstance(device, int):
            index = device
        else:
            d = torch.device(device)
            if d.type != "cuda":
                raise ValueError(f"Expected a cuda device, but got: {device}")
            if d.index is None and strict:
                raise ValueError("Expected a torch.device with a specified index or an integer, "
                                 f"but got:{device}")
            index = 0 if d.index is None else d.index
        if not 0 <= index < self.count:
            raise RuntimeError(f"CUDA error: invalid device ordinal {index}")
        return index

    def is_available(self):
        return True

    def device_count(self):
        return self.count

    def current_device(self):
        return 0

    def get_device_properties(self, device=None):
        return SimpleNamespace(name=self.name, total_memory=self.total, major=self.cc[0],
                               minor=self.cc[1], index=self._index(device))

    def get_device_capability(self, device=None):
        self._index(device)
        return self.cc

    def is_bf16_supported(self, including_emulation=True):
        # What torch reports: True on a T4 when emulation counts.
        return True if including_emulation else self.cc >= (8, 0)

    def mem_get_info(self, device=None):
        i = self._index(device, strict=device is not None)
        self.calls.append(("mem_get_info", i))
        return self.total - self.others - self.reserved[i], self.total

    def memory_reserved(self, device=None):
        return self.reserved[self._index(device)]

    def memory_allocated(self, device=None):
        return self.allocated[self._index(device)]

    def max_memory_allocated(self, device=None):
        return self.peak[self._index(device)]

    def max_memory_reserved(self, device=None):
        return self.reserved[self._index(device)]

    def reset_peak_memory_stats(self, device=None):
        i = self._index(device)
        self.peak[i] = self.allocated[i]

    def set_per_process_memory_fraction(self, fraction, device=None):
        i = self._index(device, strict=device is not None)
        if not isinstance(fraction, float):
            raise TypeError("Invalid type for fraction argument, must be `float`")
        if not 0 <= fraction <= 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        self.calls.append(("set_per_process_memory_fraction", i))
        self.fraction[i] = fraction

    def synchronize(self, device=None):
        self._index(device)

    def empty_cache(self):
        self.reserved = list(self.allocated)

    def cap(self, index=0) -> int:
        """Bytes the allocator of GPU ``index`` may reserve now."""
        return int(self.fraction[index] * self.total)

    def allocate(self, nbytes: int, index: int = 0, cached: int = 0) -> None:
        """Allocate ``nbytes`` in a new segment (the cached blocks taken as too small to serve
        it: split blocks) and keep ``cached`` more reserved but unallocated (blocks freed since),
        or raise torch's out-of-memory error where the cap or the device's free memory ends."""
        grow = nbytes + cached
        free = self.total - self.others - self.reserved[index]
        if self.reserved[index] + grow > self.cap(index) or grow > free:
            raise torch.OutOfMemoryError(self.oom_text(nbytes, index))
        self.allocated[index] += nbytes
        self.reserved[index] += grow
        self.peak[index] = max(self.peak[index], self.allocated[index])

    def oom_text(self, nbytes: int, index: int = 0) -> str:
        """Torch 2.11's out-of-memory message, sizes formatted as c10 formats them."""
        def size(n):
            return (f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB" if n >= 2**20
                    else f"{n / 2**10:.2f} KiB" if n >= 2**10 else f"{n} bytes")
        free = self.total - self.others - self.reserved[index]
        allowed = f"{size(self.cap(index))} allowed; " if self.fraction[index] < 1 else ""
        return (f"CUDA out of memory. Tried to allocate {size(nbytes)}. GPU {index} has a total "
                f"capacity of {size(self.total)} of which {size(free)} is free. Including "
                f"non-PyTorch memory, this process has {size(self.reserved[index])} memory in "
                f"use. {allowed}Of the allocated memory {size(self.allocated[index])} is "
                f"allocated by PyTorch, and {size(self.reserved[index] - self.allocated[index])} "
                "is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
                "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
                "fragmentation.  See documentation for Memory Management  "
                "(https://docs.pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def fake_cpu(monkeypatch, **flags):
    """Make torch report a CPU with AVX2 and ``flags`` (e.g. ``amx_bf16=True``), no ISA cap."""
    caps = {"cpu_name": "Test CPU", "avx2": True, **flags}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps, raising=False)  # absent before 2.7
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)


def write(folder, **files):
    """Write ``files`` (``name__ext`` -> ``name.ext``) into ``folder``; returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("__", ".")).write_text(text)
    return folder


def fake_machine(tmp_path, monkeypatch, ram: int, limit: int | None, usage: int = 0,
                 inactive: int = 0):
    """Point the guard at fake files: ``ram`` bytes of MemAvailable and a cgroup v2 root with
    ``limit`` (None: ``max``) and ``usage`` bytes."""
    (tmp_path / "meminfo").write_text(f"MemTotal: {2 * ram // 1024} kB\n"
                                      f"MemAvailable: {ram // 1024} kB\n")
    (tmp_path / "self_cgroup").write_text("0::/\n")
    write(tmp_path / "cgroup", cgroup__controllers="cpu memory",
          memory__max="max" if limit is None else str(limit), memory__current=str(usage),
          memory__stat=f"anon {usage - inactive}\ninactive_file {inactive}\n")
    monkeypatch.setattr(guard, "MEMINFO", str(tmp_path / "meminfo"))
    monkeypatch.setattr(guard, "CGROUP_ROOT", str(tmp_path / "cgroup"))
    monkeypatch.setattr(guard, "PROC_CGROUP", str(tmp_path / "self_cgroup"))


# ------------------------------------------------------------------ models and inputs

class Tiny(torch.nn.Module):
    """LayerNorm then Linear: the smallest model with a cast autocast makes and one it keeps."""

    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.ln(x))


def x_like(cfg, requires_grad=True):
    """A block's input for ``cfg``: ``(batch, seq, d_model)`` random values."""
    return torch.randn(cfg.batch_size, cfg.seq_len, cfg.d_model, requires_grad=requires_grad)


def zoo(kind: str) -> model_zoo.ZooModel:
    """A tiny model of lesson 05's zoo: ``gpt`` (the course's), ``cnn``, ``gpt2`` or ``llama``
    (Hugging Face, skipped without transformers)."""
    if kind == "gpt":
        return model_zoo.course_gpt("smoke")
    if kind == "cnn":
        return model_zoo.small_cnn(channels=8, n_blocks=2, image=8)
    pytest.importorskip("transformers")  # the [hf] extra: make test installs it
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    return model_zoo.hf_causal_lm("gpt2" if kind == "gpt2" else "llama", n_layers=2, d_model=32,
                                  n_heads=2, seq_len=16)


def peak_at(config, batch):
    """The measured peak (bytes) of ``config`` at micro-batch ``batch``."""
    return measure(config.replace(batch_size=batch), timed=False).peak_allocated


# ------------------------------------------------------------------ tables

def measured_table(rows, size="cpu"):
    """A `compare`-like table of `TINY` rows ``(label, precision, step times, peak, emulated)``,
    with its Measurements in ``attrs`` (what `evidence` and `plots.adoption_story` read)."""
    ms = []
    for _label, precision, times, peak, emulated in rows:
        m = Measurement(config=TINY.replace(precision=precision), peak_allocated=peak, emulated=emulated,
                        activations=peak // 2, autocast_weight_copies=0, logits=peak // 4,
                        parameters=400, gradients=400, optimizer_state=800)
        m.add_times(times)
        ms.append(m)
    df = pd.DataFrame([m.as_row() for m in ms])
    df["label"] = [r[0] for r in rows]
    df.attrs.update(measurements=ms, size=size)
    return df


def arm_history(label, losses, flushed):
    """An `ArmHistory` of lesson 01's arms with these validation losses and flushed shares."""
    h = ArmHistory(TINY, arm=Arm(label, "fp32"))
    h.val_steps, h.val_loss = list(range(len(losses))), list(losses)
    h.steps, h.flushed = list(range(1, len(flushed) + 1)), list(flushed)
    return h


def synthetic_profile(times: dict, *, moved: int = 0, device: str = "cpu", size: str = "cpu"):
    """A `course_utils.profiling.Profile` of a toy model, one fp32 row per policy of ``times``
    (``{policy: step times}``, seconds), with made-up bytes; ``moved`` bytes to the host for
    ``offload``."""
    from course_utils.profiling import Profile, ProfileConfig, ProfileMeasurement
    from course_utils.terms import MiB
    prof = Profile("toy", "layers", "Block", 2, 1000, 16000, "tokens", size=size)
    for i, (policy, t) in enumerate(times.items()):
        cfg = ProfileConfig("toy", "fp32", policy, 4, device, "tokens", 128)
        m = ProfileMeasurement(config=cfg, device_name=device, activations=(8 - 2 * i) * MiB,
                               autocast_weight_copies=0, logits=MiB,
                               peak_allocated=(40 - 2 * i) * MiB, grad_max_diff=0.0,
                               bytes_to_host=moved if policy == "offload" else 0)
        m.add_times(t)
        prof.measurements.append(m)
    return prof
