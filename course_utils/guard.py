"""The run guard: `check_feasible(config)`, asked by every entry point that runs a `RunConfig`,
refuses a run that would be wrong, take minutes, or not fit in memory, before it starts.

A run is refused when its estimated peak (`course_utils.memory_model.estimate`) exceeds 80% of
`memory_headroom`: on CUDA the free GPU memory; on a CPU the smaller of the free RAM
(``MemAvailable``, kernel docs ``filesystems/proc.rst``) and the cgroup's headroom, since a
container's limit gets the kernel killed instead of raising an error (`cgroup_memory`; kernel
docs ``admin-guide/cgroup-v2.rst`` and ``admin-guide/cgroup-v1/memory.rst``).
"""
from __future__ import annotations

import bisect
import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from . import stand_in
from .config import RunConfig, step_flops
from .hardware import MPS_PEAK_NOTE, HardwareInfo, detect, is_emulated
from .i18n import tr
from .memory_model import estimate
from .terms import GiB, MiB, cuda_index

__all__ = ["CGROUP_ROOT", "MEMINFO", "CgroupMemory", "MemoryRefused", "available_memory_bytes",
           "cgroup_memory", "check_feasible", "cuda_memory_cap", "memory_headroom"]

#: Where Linux mounts the cgroup file system.
CGROUP_ROOT = "/sys/fs/cgroup"
#: Linux's memory counters, ``MemAvailable`` among them.
MEMINFO = "/proc/meminfo"
#: The process's cgroup membership (``0::/path`` on v2; ``N:memory:/path`` on v1).
PROC_CGROUP = "/proc/self/cgroup"

#: A run is refused when its estimated peak exceeds this fraction of the memory free now.
_MEMORY_FRACTION = 0.8

#: A cgroup v1 limit at or above this means "no limit" (PAGE_COUNTER_MAX pages in bytes).
_NO_LIMIT = 2**60

# Step FLOPs above which emulated fp16 on a CPU is refused: 1e9 already take seconds (smoke: ~1e8).
_CPU_FP16_MAX_FLOPS = 1e9


class MemoryRefused(ValueError):
    """A run refused up front because its estimated peak exceeds the memory free here."""


@dataclass(frozen=True)
class CgroupMemory:
    """The memory limit of this process's cgroup and what it uses (bytes): ``version`` 1 or 2,
    ``path`` the folder read, ``inactive_file`` the file cache within ``usage`` that the kernel
    reclaims before an OOM kill."""

    version: int
    path: str
    limit: int
    usage: int
    inactive_file: int = 0

    @property
    def headroom(self) -> int:
        """Bytes the cgroup may still allocate: limit - (usage - inactive file cache)."""
        return max(0, self.limit - max(0, self.usage - self.inactive_file))

    def describe(self) -> str:
        """``"this container's memory limit (cgroup v2: 2.00 GiB, 1.50 GiB in use)"``."""
        used = max(0, self.usage - self.inactive_file)
        return tr("this container's memory limit (cgroup v{version}: {limit:.2f} GiB, {used:.2f} "
                  "GiB in use)", version=self.version, limit=self.limit / GiB, used=used / GiB)


def _read_int(path: Path) -> int | None:
    """The integer in a one-line cgroup file; None if missing, unreadable or ``max``."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _stat(path: Path, key: str) -> int:
    """A counter of a cgroup ``memory.stat`` file (0 when absent)."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _own_paths(proc_cgroup: str) -> dict:
    """``{"v2": "/path", "v1": "/path"}`` from ``/proc/self/cgroup`` (missing: empty)."""
    out = {}
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            out["v2"] = parts[2]
        elif "memory" in parts[1].split(","):
            out["v1"] = parts[2]
    return out


def _folders(base: Path, own: str | None) -> list[Path]:
    """``base/own`` and each of its parents up to ``base`` (a limit anywhere above applies)."""
    parts = own.strip("/").split("/") if own and own.strip("/") else []
    return [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def cgroup_memory(root: str | os.PathLike | None = None,
                  proc_cgroup: str | None = None) -> CgroupMemory | None:
    """The tightest memory limit of this process's cgroups (the one with the least headroom),
    or None (not Linux, no memory controller, no limit). Reads cgroup v2 (``memory.max``,
    ``memory.current``, ``memory.stat``'s ``inactive_file``) and v1 (``memory.limit_in_bytes``,
    ``memory.usage_in_bytes``, ``total_inactive_file``) in the process's own cgroup and each
    above it; ``max`` or a v1 limit of 2^60 or more is none. ``root`` (default `CGROUP_ROOT`) and
    ``proc_cgroup`` (default ``/proc/self/cgroup``; missing: the root cgroup): tests pass fakes.
    """
    base = Path(root if root is not None else CGROUP_ROOT)
    own = _own_paths(proc_cgroup if proc_cgroup is not None else PROC_CGROUP)
    found = []
    for folder in _folders(base, own.get("v2")):
        limit, usage = _read_int(folder / "memory.max"), _read_int(folder / "memory.current")
        if limit is not None and usage is not None:
            found.append(CgroupMemory(2, str(folder), limit, usage,
                                      _stat(folder / "memory.stat", "inactive_file")))
    for folder in _folders(base / "memory", own.get("v1")):
        limit = _read_int(folder / "memory.limit_in_bytes")
        usage = _read_int(folder / "memory.usage_in_bytes")
        if limit is not None and usage is not None and limit < _NO_LIMIT:
            found.append(CgroupMemory(1, str(folder), limit, usage,
                                      _stat(folder / "memory.stat", "total_inactive_file")))
    return min(found, key=lambda c: c.headroom) if found else None


def _free_ram(meminfo: str) -> int | None:
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def memory_headroom(hw: HardwareInfo, *, cgroup_root: str | os.PathLike | None = None,
                    meminfo: str | None = None) -> tuple[int | None, str]:
    """Bytes this process may still allocate on ``hw``'s device now (None on MPS), and the words
    that follow them in a sentence, e.g. ``(1610612736, "of RAM free now")``. CUDA:
    ``torch.cuda.mem_get_info``'s free bytes. CPU: the smaller of the free RAM (``MemAvailable``;
    physical memory without ``/proc/meminfo``) and the cgroup's headroom (`cgroup_memory`).
    ``cgroup_root``, ``meminfo``: where to read (tests pass fake files).
    """
    if hw.device == "cuda":
        try:
            index = torch.cuda.current_device()
            if stand_in.active() is not None:
                return stand_in.free_bytes(index), tr("free under the stand-in's memory cap now")
            return int(torch.cuda.mem_get_info(index)[0]), tr("of GPU memory free now")
        except (RuntimeError, AssertionError):
            return None, tr("no usable CUDA runtime")
    if hw.device != "cpu":
        return None, tr("{device} reports no free memory", device=hw.device)
    free = _free_ram(meminfo if meminfo is not None else MEMINFO)
    cgroup = cgroup_memory(cgroup_root)
    if cgroup is not None and (free is None or cgroup.headroom < free):
        return cgroup.headroom, tr("left under {limit}", limit=cgroup.describe())
    return free, tr("of RAM free now")


def available_memory_bytes(hw: HardwareInfo) -> int | None:
    """`memory_headroom`'s bytes: what this process may still allocate on ``hw``'s device
    (None on MPS)."""
    return memory_headroom(hw)[0]


def _size(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB"


def _memory_problem(config: RunConfig, hw: HardwareInfo) -> str | None:
    free, where = memory_headroom(hw)
    if not free:
        return None
    limit = _MEMORY_FRACTION * free
    peak = estimate(config).peak_allocated
    if peak <= limit:
        return None
    lo = bisect.bisect_left(range(1, config.batch_size), True, key=lambda b: estimate(
        config.replace(batch_size=b)).peak_allocated > limit)  # the peak grows with the batch
    fix = (tr("batch {batch} fits by the estimate", batch=lo) if lo else
           tr("even batch 1 does not fit: shorten the sequence, use fewer layers, or checkpoint "
              "('full')"))
    return tr("the estimated peak of {label} at batch {batch} x seq {seq} is {peak}, more than "
              "{fraction:.0%} of the {free} {where}; {fix}. Pass force=True (--force) to try "
              "anyway.", label=config.label, batch=config.batch_size, seq=config.seq_len,
              peak=_size(peak), fraction=_MEMORY_FRACTION, free=_size(free), where=where, fix=fix)


def check_feasible(config: RunConfig, hw: HardwareInfo | None = None,
                   force: bool = False) -> list[str]:
    """Refuse configurations that would be wrong or take minutes; return notes (strings) for
    the learner, e.g. that bf16 is emulated here. ``hw``: default detected; ``force``: run
    anyway (the refusals become notes). Raises ValueError for a missing device, emulated fp16 on
    a CPU above a tiny size, bf16 on a GPU that only emulates it (a T4); `MemoryRefused` (a
    ValueError) when the estimated peak exceeds 80% of `memory_headroom`, with the estimate and
    the largest batch that fits."""
    hw = hw or detect(config.device)
    problems, notes = [], []
    if is_emulated(hw, config.precision):
        if hw.device == "cpu" and config.precision == "fp16":
            flops = step_flops(config)
            if flops > _CPU_FP16_MAX_FLOPS:
                problems.append(tr(
                    "fp16 on this CPU ({name}) is emulated (no fp16 instructions): this step "
                    "({flops:.1e} FLOPs) would take minutes. Use bf16 or fp32 on a CPU, the "
                    "'smoke' size, or force=True.", name=hw.name, flops=flops))
            else:
                notes.append(tr("fp16 on this CPU is emulated; fine at this tiny size."))
        elif hw.device == "cuda":
            problems.append(tr(
                "bf16 on {name} is emulated (compute capability {capability} < 8.0): it runs, but "
                "slowly, and teaches the wrong lesson. Use fp16 with GradScaler here, or "
                "force=True.", name=hw.name,
                capability=".".join(map(str, hw.compute_capability or ()))))
        else:
            notes.append(tr("{precision} is emulated on this CPU ({name}): its memory is measured "
                            "as everywhere, its time is not the speed of real hardware.",
                            precision=config.precision, name=hw.name))
    if config.compile and hw.device == "cpu":
        notes.append(tr("torch.compile on a CPU: the first step compiles for tens of seconds."))
    if hw.device == "mps":
        notes.append(tr(MPS_PEAK_NOTE))
    if problems and not force:
        raise ValueError(" ".join(problems))
    memory = _memory_problem(config, hw)
    if memory and not force:
        raise MemoryRefused(memory)
    return problems + ([memory] if memory else []) + notes


@contextlib.contextmanager
def cuda_memory_cap(device: str | torch.device, budget_bytes: int):
    """Within the block, ``device``'s caching allocator may hold at most ``budget_bytes``
    (``torch.cuda.set_per_process_memory_fraction``), then the cache is emptied; yields the
    device's total memory (bytes)."""
    index = cuda_index(device)
    total = torch.cuda.get_device_properties(index).total_memory
    cap = stand_in.cap_bytes(index)
    budget_bytes = budget_bytes if cap is None else min(budget_bytes, cap)
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), index)
    try:
        yield total
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, index)
        stand_in.apply_memory_cap(index)  # a stand-in's cap stays in force
        torch.cuda.empty_cache()
