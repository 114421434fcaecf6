"""Step times that mean something on a shared machine: budgets, interleaved rounds, noise
bands and the verdict words (docs/method.md#time, docs/method.md#verdict-words).

`steps_for_budget` and `default_budget_s` turn a time budget into a number of steps;
`interleaved` times several training states one step each in turn, round after round;
`time_ratio` compares two series taken in the same rounds and ends in one of `VERDICTS`
(`band_verdict`); `emulated_factor` rounds an emulated precision's ratio.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .i18n import tr

__all__ = ["VERDICTS", "TOO_SMALL", "TOO_SMALL_WHY", "MIN_ROUNDS", "default_budget_s",
           "steps_for_budget", "time_step", "interleaved", "TimeRatio", "time_ratio", "spread",
           "BLOCKS", "printed_band", "band_span", "band_verdict", "agreement", "emulated_factor"]

#: The verdict at a size too small to time (docs/method.md#verdict-words), and why, in words.
TOO_SMALL = "too small to time"
TOO_SMALL_WHY = "steps of a few ms: timing not trusted at this size"

#: The words a time comparison can end in.
VERDICTS = ("faster", "slower", "within noise", "too few rounds", TOO_SMALL, "emulated",
            "not timed")

#: Consecutive blocks of rounds whose medians widen the noise band (run-to-run drift).
BLOCKS = 3

_BUDGET_S = {"smoke": 0.3, "cpu": 3.0, "a100": 2.0, "h100": 2.0}

#: Fewest rounds of alternation a comparison takes: with 3 the interquartile band of the
#: per-round ratios is too narrow on a busy machine, and verdicts flipped between runs.
MIN_ROUNDS = 5


def default_budget_s(size: str) -> float:
    """Seconds of timed steps per comparison at a size profile (``smoke`` 0.3, ``cpu`` 3,
    ``a100`` and ``h100`` 2, else 4): enough rounds for a band, a lesson near a minute
    (results/gpu-budget.md)."""
    return _BUDGET_S.get(size, 4.0)


def steps_for_budget(step_s: float, budget_s: float, lo: int = 3, hi: int = 50) -> int:
    """How many steps of ``step_s`` seconds fit in ``budget_s``, clamped to ``lo``..``hi``.

    Raises:
        ValueError: a non-positive ``step_s`` or ``budget_s``, or ``lo > hi``.
    """
    if not (step_s > 0 and budget_s > 0) or lo > hi:
        raise ValueError(tr("step_s and budget_s must be > 0 and lo <= hi, got {step_s}, "
                            "{budget_s}, {lo}, {hi}.", step_s=step_s, budget_s=budget_s, lo=lo,
                            hi=hi))
    return int(min(hi, max(lo, math.floor(budget_s / step_s))))


def _sync(device: str | None) -> None:
    kind = torch.device(device).type if device else "cpu"
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def time_step(step: Callable[[], object], device: str | None = None) -> float:
    """Seconds of one call of ``step``, the accelerator of ``device`` synchronised before and
    after. Not ``torch.utils.benchmark.Timer.timeit(1)``, which runs two warm-up calls before
    the timed one (torch 2.13): the course warms up once per configuration instead."""
    _sync(device)
    t0 = time.perf_counter()
    step()
    _sync(device)
    return time.perf_counter() - t0


def interleaved(steps: Sequence[Callable[[], object]], budget_s: float | None = None, *,
                rounds: int | None = None, min_rounds: int = MIN_ROUNDS, max_rounds: int = 50,
                progress=None, device: str | None = None) -> list[list[float]]:
    """Time each function of ``steps`` once per round: ``times[i][r]`` is step ``i`` in round
    ``r`` (seconds); round ``r`` starts from step ``r mod len(steps)``, so no step always runs
    first. ``rounds`` rounds, or as many as fit in ``budget_s`` seconds (``min_rounds`` to
    ``max_rounds``). ``progress``: a tqdm bar, or None.

    Raises:
        ValueError: no steps, neither or both of ``budget_s`` and ``rounds``, a non-positive
            budget, or fewer than 1 round.
    """
    if not steps or (budget_s is None) == (rounds is None):
        raise ValueError(tr("interleaved needs steps and exactly one of budget_s and rounds."))
    if (budget_s is not None and not budget_s > 0) or (rounds is not None and rounds < 1) \
            or min_rounds < 1:
        raise ValueError(tr("budget_s must be > 0 and rounds >= 1, got {budget_s!r}, {rounds!r}.",
                            budget_s=budget_s, rounds=rounds))
    times: list[list[float]] = [[] for _ in steps]
    if progress is not None and rounds is not None:
        progress.total = rounds * len(steps)
    t0, r, n = time.perf_counter(), 0, len(steps)
    while rounds is None or r < rounds:
        for i in [(r + k) % n for k in range(n)]:  # this round's order: rotated by one
            times[i].append(time_step(steps[i], device))
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


def printed_band(ratio: float, low: float, high: float) -> tuple[float, float]:
    """The noise band as a sentence prints it (two decimals): ``(low, high)`` of the time
    ratio when ``ratio >= 1`` ("1.26x slower"), else of the speed-up ``1/ratio`` ("1.43x
    faster", band ``1/high .. 1/low``)."""
    if ratio >= 1:
        return round(low, 2), round(high, 2)
    return round(1 / high, 2), round(1 / low, 2)


def band_span(low: float, high: float) -> str:
    """A printed noise band, ``"0.95-1.07x"``: two decimals, one from 10x, none from 100x (the
    band of a few noisy rounds supports no more)."""
    def x(v):
        return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}"
    return f"{x(low)}-{x(high)}x"


def band_verdict(ratio: float, low: float, high: float) -> str:
    """"within noise" when the noise band ``low``-``high`` of a time ratio, in either printed
    form (`printed_band`, or the time ratio at two decimals), contains 1.00; else "faster"
    (ratio < 1) or "slower"."""
    lo, hi = printed_band(ratio, low, high)
    if lo <= 1.0 <= hi or round(low, 2) <= 1.0 <= round(high, 2):
        return "within noise"
    return "faster" if ratio < 1 else "slower"


@dataclass(frozen=True)
class TimeRatio:
    """Step time of a configuration divided by a reference's, measured in the same rounds:
    ``ratio`` (below 1 is faster; None if not timed), its noise band ``low``-``high`` (None
    below 3 rounds; `time_ratio`), the paired ``rounds`` and the ``verdict`` (`VERDICTS`)."""

    ratio: float | None
    low: float | None
    high: float | None
    rounds: int
    verdict: str

    @property
    def settled(self) -> bool:
        """True when the comparison says faster or slower."""
        return self.verdict in ("faster", "slower")

    @property
    def factor(self) -> float | None:
        """How many times faster (``1/ratio``, when ratio < 1) or slower (``ratio``)."""
        if self.ratio is None:
            return None
        return 1 / self.ratio if self.ratio < 1 else self.ratio

    def band_text(self) -> str:
        """``"noise band 1.24-1.30x over 9 rounds"``, as a speed-up after "faster"; at a size
        too small to time, `TOO_SMALL_WHY` instead of the untrusted band."""
        if self.verdict == TOO_SMALL:
            return tr(TOO_SMALL_WHY)
        if self.low is None:
            return tr("1 round") if self.rounds == 1 else tr("{n} rounds", n=self.rounds)
        lo, hi = (printed_band(self.ratio, self.low, self.high) if self.verdict == "faster"
                  else (self.low, self.high))
        if self.rounds == 1:
            return tr("noise band {lo:.2f}-{hi:.2f}x over 1 round", lo=lo, hi=hi)
        return tr("noise band {lo:.2f}-{hi:.2f}x over {n} rounds", lo=lo, hi=hi, n=self.rounds)

    def describe(self, what: str | None = None) -> str:
        """``"step time 1.31x slower (noise band 1.27-1.36x over 9 rounds)"``, ``"step time
        1.43x faster (...)"``, ``"step time 1.02x (...): within noise"``, ``"step time: too
        small to time (...)"``. ``what`` names the quantity (translated by `tr`)."""
        what = tr("step time") if what is None else tr(what)
        if self.ratio is None:
            return tr("{what}: not timed", what=what)
        if self.verdict == TOO_SMALL:
            return tr("{what}: {verdict} ({why})", what=what, verdict=tr(TOO_SMALL),
                      why=tr(TOO_SMALL_WHY))
        band = self.band_text()
        if self.verdict == "emulated":  # one round or a few, of arithmetic no hardware runs
            return tr("{what} about {factor} the reference's (emulated here: not the speed of "
                      "real hardware)", what=what, factor=emulated_factor(self.ratio))
        if self.verdict == "faster":
            return tr("{what} {factor:.2f}x faster ({band})", what=what, factor=1 / self.ratio,
                      band=band)
        if self.verdict == "slower":
            return tr("{what} {ratio:.2f}x slower ({band})", what=what, ratio=self.ratio,
                      band=band)
        return tr("{what} {ratio:.2f}x ({band}): {verdict}", what=what, ratio=self.ratio,
                  band=band, verdict=tr(self.verdict))


def emulated_factor(ratio: float) -> str:
    """An emulated precision's time ratio to two significant figures (``"30x"``, ``"4.2x"``)."""
    if ratio >= 10:
        return f"{round(ratio, -1 if ratio < 100 else -2):.0f}x"
    return f"{ratio:.2g}x"


def agreement(here: TimeRatio, there: TimeRatio, there_name: str) -> str:
    """Sentences on two measurements of the same pair on one machine (say lessons 02 and 03):
    ``there`` as ``there_name`` printed it, then whether the two noise bands overlap (not
    compared where either has no band that means something)."""
    said = tr("{there} timed the same pair on this machine: {described}.", there=there_name,
              described=there.describe())
    unbanded = (TOO_SMALL, "emulated", "not timed")
    if (here.low is None or there.low is None or here.verdict in unbanded
            or there.verdict in unbanded):
        return tr("{said} The two runs are not compared: one of them has no noise band that "
                  "means something.", said=said)
    if here.low <= there.high and there.low <= here.high:
        return tr("{said} The two noise bands overlap: the two runs measured the same ratio within their "
                  "noise.", said=said)
    return tr("{said} The two noise bands do not overlap: the machine ran at a different speed "
              "during one of the runs (other programs, heat, power saving), more than either band "
              "shows, since a band measures the spread within one run. Run both lessons again on "
              "an otherwise idle machine to see which holds.", said=said)


def _band(ratios: list[float], of_medians: float) -> tuple[float, float]:
    q = statistics.quantiles(ratios, n=4, method="inclusive")
    # the ratio of the two medians too: a table beside the ratio prints those medians
    low, high = min(q[0], of_medians), max(q[2], of_medians)
    n = len(ratios)
    if n >= BLOCKS:  # the medians of consecutive blocks (sizes differ by at most one): how far
        # a re-run of the comparison could land
        edges = [round(i * n / BLOCKS) for i in range(BLOCKS + 1)]
        medians = [statistics.median(ratios[a:b]) for a, b in zip(edges, edges[1:])]
        low, high = min(low, *medians), max(high, *medians)
    return low, high


def time_ratio(times: Sequence[float], reference: Sequence[float], *, size: str = "",
               emulated: bool = False, min_rounds: int = MIN_ROUNDS,
               through: Sequence[float] | None = None) -> TimeRatio:
    """Compare step times ``times`` with ``reference`` (seconds, paired by round).

    Rule: no times -> "not timed"; emulated -> "emulated"; size ``smoke`` -> "too small to
    time"; fewer than ``min_rounds`` paired rounds -> "too few rounds"; otherwise
    `band_verdict` on the band of docs/method.md#time (`BLOCKS` blocks of rounds, reaching the
    ratio of the medians). ``through``: a third configuration's times from the same
    rounds, against which a table printed both (`course_utils.experiments.summary`); the ratio
    is then the quotient of the two ratios to it, which the band is widened to reach.
    """
    # paired only when taken in the same rounds: as many steps each (an emulated precision's one
    # profiled step is not paired with the reference's first round, but set against its median)
    pairs = [(t, r) for t, r in zip(times, reference) if t and r] \
        if len(times) == len(reference) else []
    if not pairs:
        if times and reference:  # timed, but not in the same rounds (e.g. one step each)
            ratio = statistics.median(times) / statistics.median(reference)
            return TimeRatio(ratio, None, None, 1, "emulated" if emulated else "too few rounds")
        return TimeRatio(None, None, None, 0, "not timed")
    ratios = [t / r for t, r in pairs]
    ratio = statistics.median(ratios)
    of_medians = statistics.median(t for t, _ in pairs) / statistics.median(r for _, r in pairs)
    if through is not None and len(through) == len(times) == len(reference) and all(through):
        ratio = (statistics.median(t / f for t, f in zip(times, through))
                 / statistics.median(r / f for r, f in zip(reference, through)))
        of_medians = ratio   # the quotient the table prints is the one the band must reach
    low = high = None
    if len(ratios) >= 3:
        low, high = _band(ratios, of_medians)
    if emulated:
        verdict = "emulated"
    elif size == "smoke":
        verdict = TOO_SMALL
    elif len(ratios) < min_rounds or low is None:
        verdict = "too few rounds"
    else:
        verdict = band_verdict(ratio, low, high)
    return TimeRatio(ratio, low, high, len(ratios), verdict)
