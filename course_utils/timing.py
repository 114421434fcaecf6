"""Step times that mean something on a shared machine: budgets, interleaving, noise.

* **Budgets, not step counts.** `steps_for_budget` turns a calibration step's time into the
  number of timed steps that fit a time budget; `default_budget_s` gives the budget per size
  profile.
* **Interleaved repeats.** `interleaved` times several training states one step each in turn,
  round after round, so that a change in the machine's load hits all of them alike
  (`time_step`: one call, the accelerator synchronised).
* **Noise.** `time_ratio` compares two series of step times taken in the same rounds: the
  per-round ratios' median, and their interquartile band. A difference whose band contains 1 is
  "within noise", never faster or slower; at the ``smoke`` size every time comparison is
  "inconclusive at this size" (fixed per-step overheads dominate a tiny model); a precision that
  is emulated on this hardware gives an "emulated" comparison, whose number is not the speed
  of real hardware.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

__all__ = ["VERDICTS", "MIN_ROUNDS", "default_budget_s", "steps_for_budget", "time_step",
           "interleaved", "TimeRatio", "time_ratio", "spread"]

#: The words a time comparison can end in.
VERDICTS = ("faster", "slower", "within noise", "inconclusive at this size", "emulated",
            "not timed")

_BUDGET_S = {"smoke": 0.3, "cpu": 3.0}

#: Fewest rounds of alternation a comparison takes: with 3 the interquartile band of the
#: per-round ratios is too narrow on a busy machine, and verdicts flipped between runs.
MIN_ROUNDS = 5


def default_budget_s(size: str) -> float:
    """Seconds of timed steps per comparison at a size profile (``smoke`` 0.3, ``cpu`` 3, GPU
    profiles 4): enough repeats for a median and a spread, little enough for a lesson to stay
    near two minutes."""
    return _BUDGET_S.get(size, 4.0)


def steps_for_budget(step_s: float, budget_s: float, lo: int = 3, hi: int = 50) -> int:
    """How many steps of ``step_s`` seconds fit in ``budget_s``, clamped to ``lo``..``hi``.

    Raises:
        ValueError: a non-positive ``step_s`` or ``budget_s``, or ``lo > hi``.
    """
    if not (step_s > 0 and budget_s > 0) or lo > hi:
        raise ValueError(f"step_s and budget_s must be > 0 and lo <= hi, got {step_s}, "
                         f"{budget_s}, {lo}, {hi}.")
    return int(min(hi, max(lo, math.floor(budget_s / step_s))))


def _sync(device: str | None) -> None:
    kind = torch.device(device).type if device else "cpu"
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def time_step(step: Callable[[], object], device: str | None = None) -> float:
    """Seconds of one call of ``step``, the accelerator of ``device`` synchronised before and
    after (``time.perf_counter``).

    Not ``torch.utils.benchmark.Timer.timeit(1)``: it runs two warm-up calls before the timed
    one (torch 2.13, ``Timer.timeit``), which triples the cost of every sample of a training
    step that already takes seconds (an emulated precision). The warm-up is done once per
    configuration instead (`course_utils.measure.warm_up`).
    """
    _sync(device)
    t0 = time.perf_counter()
    step()
    _sync(device)
    return time.perf_counter() - t0


def interleaved(steps: Sequence[Callable[[], object]], budget_s: float | None = None, *,
                rounds: int | None = None, min_rounds: int = MIN_ROUNDS, max_rounds: int = 50,
                progress=None, device: str | None = None) -> list[list[float]]:
    """Time each function of ``steps`` once per round, in turn: ``times[i][r]`` is step ``i``
    in round ``r`` (seconds).

    Either ``rounds`` rounds exactly, or as many as fit in ``budget_s`` seconds (the first
    round calibrates; clamped to ``min_rounds``..``max_rounds``). ``progress`` is a tqdm bar
    (or None): its total is set once the number of rounds is known, and it advances by one per
    timed step, so it shows an ETA.

    Raises:
        ValueError: no steps, neither or both of ``budget_s`` and ``rounds``, a non-positive
            budget, or fewer than 1 round.
    """
    if not steps or (budget_s is None) == (rounds is None):
        raise ValueError("interleaved needs steps and exactly one of budget_s and rounds.")
    if (budget_s is not None and not budget_s > 0) or (rounds is not None and rounds < 1) \
            or min_rounds < 1:
        raise ValueError(f"budget_s must be > 0 and rounds >= 1, got {budget_s!r}, {rounds!r}.")
    times: list[list[float]] = [[] for _ in steps]
    if progress is not None and rounds is not None:
        progress.total = rounds * len(steps)
    t0 = time.perf_counter()
    r = 0
    while rounds is None or r < rounds:
        for i, step in enumerate(steps):
            times[i].append(time_step(step, device))
            if progress is not None:
                progress.update(1)
        r += 1
        if rounds is None:
            rounds = steps_for_budget(time.perf_counter() - t0, budget_s, min_rounds, max_rounds)
            if progress is not None:
                progress.total = rounds * len(steps)
                progress.refresh()
    return times


def spread(samples: Sequence[float]) -> float | None:
    """Interquartile range of ``samples`` (None with fewer than 2)."""
    if len(samples) < 2:
        return None
    q = statistics.quantiles(samples, n=4, method="inclusive")
    return q[2] - q[0]


@dataclass(frozen=True)
class TimeRatio:
    """Step time of a configuration divided by a reference's, measured in the same rounds.

    Attributes:
        ratio: median of the per-round ratios (None if not timed).
        low, high: the first and third quartile of the per-round ratios (None with fewer than
            3 rounds).
        rounds: the number of paired rounds.
        verdict: one of `VERDICTS`.
    """

    ratio: float | None
    low: float | None
    high: float | None
    rounds: int
    verdict: str

    @property
    def settled(self) -> bool:
        """True when the comparison says faster or slower (outside the noise, on real
        arithmetic, at a size that means something)."""
        return self.verdict in ("faster", "slower")

    def describe(self, what: str = "step time") -> str:
        """``"step time 1.31x (IQR 1.27-1.36x over 9 rounds): slower"`` and the like."""
        if self.ratio is None:
            return f"{what}: not timed"
        band = (f" (IQR {self.low:.2f}-{self.high:.2f}x over {self.rounds} rounds)"
                if self.low is not None else f" ({self.rounds} round{'s' * (self.rounds != 1)})")
        word = {"emulated": "emulated here, not the speed of real hardware"}.get(self.verdict,
                                                                                self.verdict)
        return f"{what} {self.ratio:.2f}x{band}: {word}"


def time_ratio(times: Sequence[float], reference: Sequence[float], *, size: str = "",
               emulated: bool = False) -> TimeRatio:
    """Compare step times ``times`` with ``reference`` (seconds, paired by round).

    Rule: no times -> "not timed"; an emulated precision on either side -> "emulated" (the
    ratio is reported, labelled); size ``smoke`` -> "inconclusive at this size"; fewer than 3
    paired rounds -> "inconclusive at this size" unless the ratio is beyond 2x either way;
    otherwise "within noise" when the interquartile band of the per-round ratios contains 1,
    else "faster" (< 1) or "slower" (> 1).
    """
    pairs = [(t, r) for t, r in zip(times, reference) if t and r]
    if not pairs:
        if times and reference:  # timed, but not in the same rounds (e.g. one step each)
            ratio = statistics.median(times) / statistics.median(reference)
            return TimeRatio(ratio, None, None, 1, "emulated" if emulated else
                             ("slower" if ratio > 2 else "faster" if ratio < 0.5
                              else "inconclusive at this size"))
        return TimeRatio(None, None, None, 0, "not timed")
    ratios = [t / r for t, r in pairs]
    ratio = statistics.median(ratios)
    low = high = None
    if len(ratios) >= 3:
        q = statistics.quantiles(ratios, n=4, method="inclusive")
        low, high = q[0], q[2]
    if emulated:
        verdict = "emulated"
    elif size == "smoke":
        verdict = "inconclusive at this size"
    elif low is None:
        verdict = ("slower" if ratio > 2 else "faster" if ratio < 0.5
                   else "inconclusive at this size")
    elif low <= 1 <= high:
        verdict = "within noise"
    else:
        verdict = "faster" if ratio < 1 else "slower"
    return TimeRatio(ratio, low, high, len(ratios), verdict)
