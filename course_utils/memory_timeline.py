"""Memory over one step: bytes allocated after every allocation and free, with phases.

`memory_timeline(fn)` runs ``fn()`` once and returns a `Timeline` with the phases ``fn`` marked
(`phase`); `peak_during`, `peak_bytes` and `allocated_after` give the peak and what is left;
`step_phases` splits a training step into its phases with `course_utils.measure.memory_step`'s
events. The events: ``torch.profiler``'s on a CPU; on CUDA the caching allocator's history
(``torch.cuda.memory._record_memory_history``, "Understanding CUDA Memory Usage" in the PyTorch
docs) or its counters; MPS has none (docs/method.md#memory).

Over 400 lines because it reads one protocol two ways, the CPU profiler's events and the CUDA
allocator's history and counters, with the phases marked in both.
"""
from __future__ import annotations

import contextlib
import contextvars
import gc
import os
import sys
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Callable

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile

from .i18n import tr
from .saved_tensors import storage_bytes
from .terms import MiB

__all__ = ["Phase", "Timeline", "phase", "memory_timeline", "peak_bytes", "peak_during",
           "allocated_after", "STEP_PHASES", "StepPhases", "step_phases"]

_PREFIX = "phase:"
# The CUDA mark recorder of the running memory_timeline (None outside one).
_RECORDER: contextvars.ContextVar = contextvars.ContextVar("course_timeline_recorder", default=None)


@dataclass(frozen=True)
class Phase:
    """A marked part of a timeline: ``name`` from ``start_ms`` to ``end_ms`` (milliseconds)."""

    name: str
    start_ms: float
    end_ms: float


@dataclass
class Timeline:
    """Bytes allocated over one run of ``fn`` on ``device``, taken by ``method`` (words):
    ``allocated`` after each event (bytes relative to ``fn``'s start) at ``t_ms``
    (milliseconds from the first event), the `Phase` ranges ``fn`` marked, and ``fn``'s
    ``result`` (kept alive, so ``final_bytes`` includes what it holds)."""

    device: str
    method: str
    t_ms: list = field(default_factory=list)
    allocated: list = field(default_factory=list)
    phases: list = field(default_factory=list)
    result: Any = field(default=None, repr=False)

    @property
    def peak_bytes(self) -> int:
        """The highest ``allocated`` value (bytes above the start; 0 if nothing was allocated)."""
        return max([0, *self.allocated])

    @property
    def final_bytes(self) -> int:
        """Bytes still allocated when ``fn`` returned (relative to its start)."""
        return self.allocated[-1] if self.allocated else 0

    def phase_peak(self, name: str) -> int:
        """Peak ``allocated`` (bytes) during the phase called ``name``.

        Raises:
            ValueError: no phase has that name.
        """
        spans = [p for p in self.phases if p.name == name]
        if not spans:
            raise ValueError(tr("no phase {name!r} in this timeline: phases are {phases}.",
                                name=name, phases=[p.name for p in self.phases]))
        vals = [a for t, a in zip(self.t_ms, self.allocated)
                if any(p.start_ms <= t <= p.end_ms for p in spans)]
        return max([0, *vals])

    def peak_moment(self) -> tuple[str | None, float | None]:
        """Where the peak falls: ``(phase name, fraction of that phase elapsed, 0 to 1)`` at the
        first event with the highest ``allocated``; ``(None, None)`` when no marked phase
        contains it (or nothing was allocated)."""
        if not self.allocated or self.peak_bytes <= 0:
            return None, None
        t = self.t_ms[self.allocated.index(max(self.allocated))]
        for p in self.phases:
            if p.start_ms <= t <= p.end_ms:
                span = p.end_ms - p.start_ms
                return p.name, (t - p.start_ms) / span if span > 0 else 0.0
        return None, None

    def allocated_at(self, t_ms: float) -> int:
        """``allocated`` after the last event at or before ``t_ms`` (0 before the first)."""
        before = [a for t, a in zip(self.t_ms, self.allocated) if t <= t_ms]
        return before[-1] if before else 0


@contextlib.contextmanager
def phase(name: str):
    """Mark a phase of a function that `memory_timeline` runs (``with phase("backward"):``);
    outside a timeline, only a profiler annotation.

    Raises:
        ValueError: ``name`` is not a non-empty string.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(tr("a phase name is a non-empty string, got {name!r}.", name=name))
    recorder = _RECORDER.get()
    if recorder is not None:
        recorder.mark()
    try:
        with torch.profiler.record_function(_PREFIX + name):
            yield
    finally:
        if recorder is not None:
            recorder.mark(name)


def _optimizer_state_bytes(optimizer) -> int:
    return storage_bytes(v for st in optimizer.state.values() for v in st.values()
                         if isinstance(v, torch.Tensor))


def _device(device) -> torch.device:
    dev = torch.device("cpu" if device is None else device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


@contextlib.contextmanager
def _silence_native_stderr():
    """Point file descriptor 2 at /dev/null, where the profiler logs start/stop (torch 2.13)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no real fd 2 (embedded interpreters)
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _cpu_timeline(fn: Callable) -> Timeline:
    with _silence_native_stderr():
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            result = fn()
    mem, marks = [], []
    for e in prof.profiler.kineto_results.events():
        name = e.name()
        if name == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU:
            mem.append((e.start_ns(), e.nbytes()))
        elif name.startswith(_PREFIX):
            marks.append((name[len(_PREFIX):], e.start_ns(), e.start_ns() + e.duration_ns()))
    mem.sort()
    marks.sort(key=lambda m: m[1])
    starts = [t for t, _ in mem] + [s for _, s, _ in marks]
    t0 = min(starts) if starts else 0
    return Timeline(
        device="cpu",
        method=tr("torch.profiler memory events (profile_memory=True), bytes relative to the "
                  "start"),
        t_ms=[(t - t0) / 1e6 for t, _ in mem],
        allocated=list(accumulate(int(n) for _, n in mem)),
        phases=[Phase(n, (s - t0) / 1e6, (e - t0) / 1e6) for n, s, e in marks],
        result=result)


def _trace_timeline(trace: list, marks: list, device: str, method: str, result=None) -> Timeline:
    """A `Timeline` from allocator trace entries and phase marks ``(name, first, stop)``."""
    events = [(e["time_us"], e["size"] if e["action"] == "alloc" else -e["size"], i)
              for i, e in enumerate(trace) if e.get("action") in ("alloc", "free_completed")]
    t0 = trace[0]["time_us"] if trace else 0
    phases = []
    for name, i0, i1 in marks:
        inside = [trace[i]["time_us"] for i in range(max(0, i0), min(i1, len(trace)))]
        if inside:
            phases.append(Phase(name, (min(inside) - t0) / 1e3, (max(inside) - t0) / 1e3))
    return Timeline(device=device, method=method, t_ms=[(t - t0) / 1e3 for t, _, _ in events],
                    allocated=list(accumulate(int(s) for _, s, _ in events)), phases=phases,
                    result=result)


class _CudaMarks:
    """Records, at each phase boundary, how many allocator trace entries exist."""

    def __init__(self, dev: torch.device):
        self.dev = dev
        self.marks: list = []
        self._open: int | None = None

    def trace(self) -> list:
        snap = torch.cuda.memory._snapshot()
        traces = snap.get("device_traces", [])
        return traces[self.dev.index] if self.dev.index < len(traces) else []

    def mark(self, name: str | None = None) -> None:
        torch.cuda.synchronize(self.dev)
        n = len(self.trace())
        if name is None:
            self._open = n
        else:
            self.marks.append((name, self._open if self._open is not None else n, n))
            self._open = None


def _cuda_timeline(fn: Callable, dev: torch.device) -> Timeline:
    history = torch.cuda.memory._record_memory_history
    recorder = _CudaMarks(dev)
    torch.cuda.synchronize(dev)
    with torch.cuda.device(dev):
        try:
            history(enabled="all", context=None, device=dev, clear_history=True)
        except TypeError:  # older torch: no clear_history
            history(enabled="all", context=None, device=dev)
        start = len(recorder.trace())
        token = _RECORDER.set(recorder)
        try:
            result = fn()
            torch.cuda.synchronize(dev)
            trace = recorder.trace()
        finally:
            _RECORDER.reset(token)
            history(enabled=None)
    marks = [(n, i0 - start, i1 - start) for n, i0, i1 in recorder.marks]
    return _trace_timeline(trace[start:], marks, str(dev),
                           tr("CUDA caching allocator memory history (alloc / free_completed)"),
                           result)


def memory_timeline(fn: Callable[[], Any], device: str | torch.device | None = None) -> Timeline:
    """Run ``fn()`` (no arguments; mark its parts with `phase`) once and return the `Timeline`
    of the bytes allocated on ``device`` (``"cpu"``, the default, or ``"cuda[:N]"``).

    Raises:
        ValueError: a device with no event source here (MPS, or CUDA on a machine without it).
    """
    dev = _device(device)
    if dev.type == "cpu":
        return _cpu_timeline(fn)
    if dev.type == "cuda" and torch.cuda.is_available():
        return _cuda_timeline(fn, dev)
    raise ValueError(tr("memory_timeline has no memory events for device {device!r}: use 'cpu' "
                        "or an available 'cuda' device (MPS has no allocation history: "
                        "course_utils.hardware.memory_device() names the device to measure on).",
                        device=str(dev)))


def peak_during(fn: Callable[[], Any],
                device: str | torch.device | None = None) -> tuple[int | None, Any]:
    """Run ``fn()`` and return ``(peak, result)``: the peak bytes allocated on ``device`` while it
    ran, above the start (CUDA: ``max_memory_allocated``; CPU: `memory_timeline`; None on other
    devices), and what ``fn`` returned."""
    dev = _device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        result = fn()
        torch.cuda.synchronize(dev)
        return max(0, int(torch.cuda.max_memory_allocated(dev) - base)), result
    if dev.type == "cpu":
        tl = memory_timeline(fn, dev)
        return tl.peak_bytes, tl.result
    return None, fn()


def peak_bytes(fn: Callable[[], Any], device: str | torch.device | None = None) -> int | None:
    """`peak_during` without the result: peak bytes above the start while ``fn()`` runs."""
    return peak_during(fn, device)[0]


def allocated_after(fn: Callable[[], Any],
                    device: str | torch.device | None = None) -> tuple[Any, int | None]:
    """Run ``fn()`` and return ``(result, bytes)``: what it returned, and the bytes still allocated
    on ``device`` when it returned, relative to its start (after a forward: the saved tensors,
    wherever they are kept, plus the output). CUDA: ``memory_allocated``; CPU: `memory_timeline`;
    None on other devices."""
    dev = _device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize(dev)
        before = torch.cuda.memory_allocated(dev)
        result = fn()
        torch.cuda.synchronize(dev)
        return result, int(torch.cuda.memory_allocated(dev) - before)
    if dev.type == "cpu":
        tl = memory_timeline(fn, dev)
        return tl.result, tl.final_bytes
    return fn(), None


# --- one training step, split into its phases -------------------------------------------------

#: The phases of a training step, in order, as `step_phases` names them.
STEP_PHASES = ("forward", "backward", "optimizer step")


@dataclass
class StepPhases:
    """Memory over one training step by phase (`step_phases`), bytes allocated with the
    ``start_bytes`` (parameters + optimizer state) included: the step's ``peak_bytes``, and per
    phase of `STEP_PHASES` its highest allocation (``peaks``) and what was allocated when it
    last ended (``ends``). Backward runs to the optimizer step (``unscale_``, clipping)."""

    device: str
    method: str
    start_bytes: int
    peak_bytes: int
    peaks: dict
    ends: dict

    @property
    def peak_phase(self) -> str | None:
        """The phase that holds the step's peak (None if no phase reached it)."""
        return next((p for p, b in self.peaks.items() if b == self.peak_bytes), None)

    def table(self) -> pd.DataFrame:
        """One row per phase: ``peak MiB`` and ``allocated at its end MiB`` (2^20 bytes)."""
        return pd.DataFrame({"peak MiB": self.peaks, "allocated at its end MiB": self.ends}) / MiB


class _Marks:
    """Opens and closes the phases of one step from hooks, calling ``on_start`` / ``on_end``."""

    def __init__(self, on_start: Callable, on_end: Callable):
        self.open: str | None = None
        self.on_start, self.on_end = on_start, on_end

    def switch(self, name: str | None) -> None:
        if self.open is not None:
            self.on_end(self.open)
        self.open = name
        if name is not None:
            self.on_start(name)

    @contextlib.contextmanager
    def hooked(self, state):
        marks = [state.model.register_forward_pre_hook(lambda *_: self.switch("forward")),
                 state.model.register_forward_hook(lambda *_: self.switch("backward")),
                 state.optimizer.register_step_pre_hook(lambda *_: self.switch("optimizer step")),
                 state.optimizer.register_step_post_hook(lambda *_: self.switch(None))]
        try:
            yield
        finally:
            self.switch(None)
            for h in marks:
                h.remove()


def _cpu_phases(state) -> tuple[int, dict, dict]:
    """CPU: the profiler's memory events of one step, the phases marked as profiler ranges."""
    ranges: dict = {}

    def start(name):
        ranges[name] = torch.profiler.record_function(_PREFIX + name)
        ranges[name].__enter__()

    marks = _Marks(start, lambda name: ranges.pop(name).__exit__(None, None, None))

    def run():
        with marks.hooked(state):
            return state.step()

    tl = _cpu_timeline(run)
    peaks = {n: tl.phase_peak(n) for n in STEP_PHASES if any(p.name == n for p in tl.phases)}
    ends = {n: tl.allocated_at(max(p.end_ms for p in tl.phases if p.name == n)) for n in peaks}
    return tl.peak_bytes, peaks, ends


def _cuda_phases(state, dev: torch.device) -> tuple[int, dict, dict]:
    """CUDA: the allocator's peak counter, read and reset at every phase boundary."""
    peaks: dict = {}
    ends: dict = {}
    top = [0]

    def segment_peak() -> int:  # the peak since the last boundary, then reset
        torch.cuda.synchronize(dev)
        p = int(torch.cuda.max_memory_allocated(dev)) - base
        top[0] = max(top[0], p)
        torch.cuda.reset_peak_memory_stats(dev)
        return p

    def end(name):
        peaks[name] = max(peaks.get(name, 0), segment_peak())
        ends[name] = int(torch.cuda.memory_allocated(dev)) - base

    marks = _Marks(lambda name: segment_peak(), end)
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    base = int(torch.cuda.memory_allocated(dev))
    with marks.hooked(state):
        state.step()
    segment_peak()
    return top[0], peaks, ends


def step_phases(state) -> StepPhases:
    """Run one training step of ``state`` (a warmed-up `course_utils.training.TrainState`) and
    measure its memory by phase: forward (the model's forward pre-hook to its forward hook),
    backward (to the optimizer's step pre-hook), optimizer step (to its step post-hook). The
    bytes are `course_utils.measure.memory_step`'s: ``peak_bytes`` equals ``measure()``'s peak.

    Raises:
        ValueError: a device with no memory events here (MPS: measure on the CPU).
    """
    dev = _device(state.config.device)
    start = storage_bytes(state.module.parameters()) + _optimizer_state_bytes(state.optimizer)
    if dev.type == "cpu":
        peak, peaks, ends = _cpu_phases(state)
        method = tr("torch.profiler memory events, phases marked by module and optimizer hooks")
    elif dev.type == "cuda" and torch.cuda.is_available():
        peak, peaks, ends = _cuda_phases(state, dev)
        method = tr("CUDA allocator: max_memory_allocated, read and reset at each phase boundary")
    else:
        raise ValueError(tr("step_phases has no memory events for device {device!r}: measure on "
                            "'cpu' or an available 'cuda' device.", device=str(dev)))
    return StepPhases(device=str(dev), method=method, start_bytes=start, peak_bytes=start + peak,
                      peaks={n: start + b for n, b in peaks.items()},
                      ends={n: start + b for n, b in ends.items()})

