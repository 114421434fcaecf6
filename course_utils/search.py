"""The largest micro-batch of a configuration that fits a memory budget (`largest_batch`: the
analytic estimate predicts it, measurements steer it) and the race of the configurations at
their largest batches, timed in alternation, per token (`race`; lesson 03, C20).
"""
from __future__ import annotations

import bisect
import contextlib
import math
from dataclasses import dataclass, field

import pandas as pd
import torch

from . import stand_in
from .config import RunConfig
from .experiments import compare, plain_label, round_sig
from .guard import MemoryRefused, cuda_memory_cap
from .i18n import tr
from .measure import Measurement, measure
from .memory_model import estimate
from .step_timing import TimeRatio, time_ratio
from .terms import GiB, MiB, check_positive_int, cuda_index, device_kind
from .training import train_step

__all__ = ["BatchSearch", "Probe", "Race", "largest_batch", "memory_budget", "race"]


@dataclass(frozen=True)
class Probe:
    """One measured batch size of a `largest_batch` search: measured and estimated peak bytes
    (``peak_allocated`` None after out of memory), whether it fits, the median step time (s)."""

    batch_size: int
    peak_allocated: int | None
    estimated_peak: int
    fits: bool
    oom: bool
    step_time_s: float | None
    tokens_per_s: float | None


@dataclass
class BatchSearch:
    """The result of `largest_batch` for one configuration: ``batch_size``, the largest that
    fits (0: none), and its ``measurement``; every probe in order; ``method``, how "fits" was
    decided here, in words; ``estimated``, ``[(batch, estimated peak bytes)...]`` from 1 to the
    largest probed + 1; ``first_too_big`` (None when ``max_batch`` fits)."""

    config: RunConfig
    budget_bytes: int
    batch_size: int
    measurement: Measurement | None
    probes: list = field(default_factory=list)
    method: str = ""
    estimated: list = field(default_factory=list)
    first_too_big: int | None = None

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens/s measured at the largest fitting batch (None if nothing fits)."""
        return None if self.measurement is None else self.measurement.tokens_per_s

    @property
    def label(self) -> str:
        """The configuration's label without its batch (e.g. ``bf16+full``)."""
        return self.config.label

    def as_row(self) -> dict:
        """A flat dict for a table: ``config`` (in words), ``largest batch``, ``tokens/step``,
        ``peak MiB`` (three significant figures), ``first batch too big``, ``measurements``."""
        m = self.measurement
        return {"config": plain_label(self.label), "largest batch": self.batch_size,
                "tokens/step": self.batch_size * self.config.seq_len * self.config.grad_accum_steps,
                "peak MiB": None if m is None or m.peak_allocated is None
                else round_sig(m.peak_allocated / MiB),
                "first batch too big": self.first_too_big,
                "measurements": len(self.probes)}


def memory_budget(fraction: float = 0.5, device: str = "cuda") -> int:
    """A memory budget in bytes: ``fraction`` of the GPU memory free now (`stand_in.free_bytes`);
    ValueError for ``fraction`` outside (0, 1] or a ``device`` that is not an available GPU."""
    if not 0 < fraction <= 1:
        raise ValueError(tr("fraction must be in (0, 1], got {fraction!r}.", fraction=fraction))
    if device_kind(device) != "cuda" or not torch.cuda.is_available():
        raise ValueError(tr("memory_budget reads free GPU memory, and device {device!r} is not an "
                            "available CUDA device; on a CPU pass a budget in bytes (e.g. a "
                            "measured peak) to largest_batch instead.", device=device))
    return int(stand_in.free_bytes(cuda_index(device)) * fraction)


def _predict_largest(config: RunConfig, budget: int, max_batch: int) -> int:
    """Largest b in 1..max_batch with estimate(b).peak <= budget (0 if none); the peak grows with b."""
    return bisect.bisect_left(range(1, max_batch + 1), True, key=lambda b: estimate(
        config.replace(batch_size=b)).peak_allocated > budget)


def _estimated_slope(config: RunConfig) -> float:
    """Estimated bytes per extra sequence of the batch, where activations dominate the peak."""
    m = 4096
    return max(1.0, (estimate(config.replace(batch_size=2 * m)).peak_allocated
                     - estimate(config.replace(batch_size=m)).peak_allocated) / m)


class _Search:
    """The state of one `largest_batch` search: the measured batches and the boundary."""

    def __init__(self, config: RunConfig, budget: int, max_batch: int, steps: int, warmup: int):
        self.config, self.budget, self.max_batch = config, budget, max_batch
        self.steps, self.warmup = steps, warmup
        self.probes: dict[int, Probe] = {}
        self.results: dict[int, Measurement] = {}
        self.lo, self.hi = 0, max_batch + 1  # largest batch known to fit; smallest known not to
        self.est_slope = _estimated_slope(config)

    def probe(self, b: int) -> None:
        """Measure batch ``b`` (memory, and ``steps`` timed steps) and move the boundary."""
        cfg = self.config.replace(batch_size=b)
        try:
            m = measure(cfg, steps=self.steps or None, warmup=self.warmup, timed=self.steps > 0)
        except MemoryRefused as refused:
            m = Measurement(config=cfg, oom=True, error=str(refused))
        fits = (not m.oom) and m.peak_allocated is not None and m.peak_allocated <= self.budget
        self.probes[b] = Probe(b, m.peak_allocated, estimate(cfg).peak_allocated, fits, m.oom,
                               m.step_time_s, m.tokens_per_s)
        self.results[b] = m
        if fits:
            self.lo = b
        else:
            self.hi = b

    def slope(self) -> float:
        """Bytes per sequence: the secant of the two measured peaks nearest the budget, unless
        under half the estimate's (the peak still in the flat optimizer step)."""
        pts = [(p.batch_size, p.peak_allocated) for p in self.probes.values()
               if p.peak_allocated is not None]
        near = sorted(pts, key=lambda q: abs(q[1] - self.budget))[:2]
        if len(near) == 2 and near[0][0] != near[1][0]:
            measured = (near[0][1] - near[1][1]) / (near[0][0] - near[1][0])
            if measured >= self.est_slope / 2:
                return measured
        return self.est_slope

    def next_guess(self, b: int) -> int:
        """The batch whose peak the slope from ``b``'s measured peak puts at the budget."""
        if self.probes[b].peak_allocated is None:  # out of memory without a peak: bisect
            return (self.lo + self.hi) // 2
        guess = b + math.floor((self.budget - self.probes[b].peak_allocated) / self.slope())
        if self.probes[b].fits and guess <= b:
            guess = b + 1  # no room predicted: check the next batch up
        return guess

    def run(self, guided_probes: int) -> None:
        """Measure until a fitting batch and the next one up, not fitting, are known."""
        b = max(1, _predict_largest(self.config, self.budget, self.max_batch))
        guided = 0
        while self.hi - self.lo > 1:
            if guided >= guided_probes or not self.lo < b < self.hi or b in self.probes:
                # no upper bound measured yet: double; else bisect
                b = (min(2 * self.lo, self.max_batch) if self.hi > self.max_batch and self.lo > 0
                     else (self.lo + self.hi) // 2)
            guided += 1
            self.probe(b)
            b = min(max(self.next_guess(b), self.lo + 1), self.hi - 1)

    def result(self, method: str) -> BatchSearch:
        top = min(max(self.probes) + 1, self.max_batch) if self.probes else 1
        curve = [(b, estimate(self.config.replace(batch_size=b)).peak_allocated)
                 for b in range(1, top + 1)]
        return BatchSearch(config=self.config, budget_bytes=self.budget, batch_size=self.lo,
                           measurement=self.results.get(self.lo),
                           probes=list(self.probes.values()), method=method, estimated=curve,
                           first_too_big=self.hi if self.hi <= self.max_batch else None)


def largest_batch(config: RunConfig, budget_bytes: int, max_batch: int = 1024, steps: int = 3,
                  warmup: int = 1, guided_probes: int = 4) -> BatchSearch:
    """The largest micro-batch of ``config`` whose measured step fits in ``budget_bytes``.

    The estimate predicts the largest batch, which is measured (`course_utils.measure.measure`);
    each next guess is a secant step from the two measured peaks nearest the budget, until a
    fitting ``b`` and a non-fitting ``b + 1`` are measured (or ``b == max_batch``). After
    ``guided_probes`` guesses it doubles and bisects, so it always ends (typically two to four
    measurements). A batch fits when its step raises no out-of-memory error and its measured
    peak is at most the budget; on CUDA the allocator is limited to the budget during the
    search (`course_utils.guard.cuda_memory_cap`). ``config.batch_size`` is ignored
    (accumulation is kept); ``steps``: timed steps per measurement (0: memory only); ``warmup``:
    optimizer steps before (>= 1: AdamW's state must exist). ValueError for a non-positive
    budget, ``max_batch``, ``warmup`` or ``guided_probes``, a negative ``steps``, a device
    without a peak-memory counter (MPS), or a configuration `measure` refuses.
    """
    for name, v in (("budget_bytes", budget_bytes), ("max_batch", max_batch),
                    ("warmup", warmup), ("guided_probes", guided_probes)):
        check_positive_int(name, v)
    check_positive_int("steps", steps, minimum=0)
    kind = device_kind(config.device)
    if kind not in ("cpu", "cuda"):
        raise ValueError(tr("largest_batch needs a peak-memory counter; device {device!r} has "
                            "none (use 'cpu' or 'cuda').", device=config.device))
    if kind == "cuda":
        method = tr("CUDA: allocator limited to the budget ({budget:.2f} GiB of {memory}); a "
                    "batch fits if its step raises no out-of-memory error and "
                    "max_memory_allocated <= budget", budget=budget_bytes / GiB,
                    memory=stand_in.memory_text(cuda_index(config.device)))
    else:
        method = tr("CPU: a batch fits if its measured peak (parameters + optimizer state + "
                    "profiler peak over one step) <= budget")

    search = _Search(config, budget_bytes, max_batch, steps, warmup)
    cap = cuda_memory_cap(config.device, budget_bytes) if kind == "cuda" else contextlib.nullcontext()
    with cap:
        search.run(guided_probes)
    return search.result(method)


@dataclass
class Race:
    """`race`'s result: ``table``, `course_utils.experiments.compare`'s (plain rows first) with
    ``time_per_token_s`` (median seconds); ``plain`` and ``checkpointed``, the configuration of
    each kind with the most tokens/s; ``per_token``, their ratio of seconds per token."""

    table: pd.DataFrame
    plain: RunConfig
    checkpointed: RunConfig
    per_token: TimeRatio
    budget_bytes: int

    def describe(self) -> str:
        """One sentence from the numbers: who won, at which batches, and how sure."""
        p, c = self.plain, self.checkpointed
        return tr("{checkpointed} at micro-batch {checkpointed_batch} against {plain} at "
                  "micro-batch {plain_batch}, both under {budget:,.1f} MiB: {described}",
                  checkpointed=plain_label(c.label), checkpointed_batch=c.batch_size,
                  plain=plain_label(p.label), plain_batch=p.batch_size,
                  budget=self.budget_bytes / MiB,
                  described=self.per_token.describe(tr("time per token")))

    def reading(self) -> str:
        """Whether checkpointing's larger batch repaid its recompute, from the per-token verdict."""
        v = self.per_token.verdict
        c, p = self.checkpointed.batch_size, self.plain.batch_size
        if c <= p:
            return tr("Here checkpointing fit no larger micro-batch than the plain configuration "
                      "({checkpointed} against {plain}): the race compares the recompute alone.",
                      checkpointed=c, plain=p)
        if v == "faster":
            return tr("Here the larger batch that checkpointing let fit repaid its recompute: "
                      "more tokens per second under the same memory budget.")
        if v == "slower":
            return tr("Here the larger batch did not repay the recompute: the plain "
                      "configuration trains more tokens per second under the same memory budget.")
        return tr("Here the race cannot tell whether the larger batch repaid the recompute "
                  "({verdict}).", verdict=tr(v))


def race(searches: list[BatchSearch], budget_s: float | None = None, steps: int | None = None,
         progress: bool = True, step_fn=None) -> Race:
    """Time every configuration of ``searches`` at its largest batch, in alternation, and
    compare the checkpointed one with the most tokens/s with the plain one with the most, per
    token, round by round (C20, C7). ValueError without a fitting plain and a fitting
    checkpointed configuration, or for searches under different budgets."""
    fitting = [s for s in searches if s.measurement is not None and s.batch_size > 0]
    plain = [s for s in fitting if s.config.checkpoint == "none"]
    ckpt = [s for s in fitting if s.config.checkpoint != "none"]
    if not plain or not ckpt:
        raise ValueError(tr("race needs a plain and a checkpointed configuration that fit the "
                            "budget; fitting: {fitting}.", fitting=[s.label for s in fitting])
                         if fitting else
                         tr("race needs a plain and a checkpointed configuration that fit the "
                            "budget; fitting: none."))
    if len({s.budget_bytes for s in searches}) != 1:
        raise ValueError(tr("race compares searches made under one budget; these differ: "
                            "{budgets}.", budgets=sorted({s.budget_bytes for s in searches})))
    order = plain + ckpt
    configs = [s.config.replace(batch_size=s.batch_size) for s in order]
    df = compare(configs, budget_s=budget_s, steps=steps, progress=progress,
                 step_fn=step_fn or train_step)
    ms = df.attrs["measurements"]
    df["time_per_token_s"] = [None if m.step_time_s is None else
                              m.step_time_s / m.config.tokens_per_step for m in ms]
    b, a = (ms[max(rows, key=lambda i: ms[i].tokens_per_s or 0.0)]  # the fastest of each kind
            for rows in (range(len(plain)), range(len(plain), len(order))))
    per_token = time_ratio([t / a.config.tokens_per_step for t in a.step_times_s],
                           [t / b.config.tokens_per_step for t in b.step_times_s],
                           size=df.attrs.get("size", ""), emulated=a.emulated or b.emulated)
    return Race(df, b.config, a.config, per_token, searches[0].budget_bytes)
