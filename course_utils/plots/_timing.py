"""What a chart may say about a step-time ratio: the ratio only outside the measured noise
(docs/method.md#verdict-words), from a `course_utils.experiments.compare` table's ``time_ratio``,
``time_ratio_low``/``time_ratio_high``, ``time_verdict`` and ``emulated``; tables without them
fall back on the interquartile ranges (``step_time_iqr_s``), else "(noise unknown)".
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..i18n import tr
from ._style import column, nan


def not_drawn() -> str:
    """What stands where an emulated time would be: emulated times are never drawn on a time axis."""
    return tr("emulated:\nnot drawn")


@dataclass(frozen=True)
class TimeNote:
    """The annotation of one row's step time.

    Attributes:
        text: what to print by the bar ("" for nothing), in the learner's language.
        verdict: `course_utils.step_timing.VERDICTS`, ``"reference"`` or ``"unknown"``.
        emulated: the precision is emulated here (no bar on a time axis).
        band: ``(low, high)`` of the ratio's spread divided by the ratio, or None.
        ratio: the ratio to the reference row (``time_ratio``), or None where not finite.
    """

    text: str
    verdict: str
    emulated: bool = False
    band: tuple[float, float] | None = None
    ratio: float | None = None


def _is_true(v) -> bool:
    return bool(v) and not (isinstance(v, float) and np.isnan(v))


def _verdict_from_iqr(t, iqr, t_ref, iqr_ref) -> str | None:
    """Disjoint interquartile ranges -> faster/slower, overlapping -> within noise, none -> None."""
    vals = np.array([nan(t), nan(iqr), nan(t_ref), nan(iqr_ref)])
    if np.isnan(vals).any() or vals[1] <= 0 or vals[3] <= 0:
        return None
    lo, hi = t - iqr / 2, t + iqr / 2
    lo_ref, hi_ref = t_ref - iqr_ref / 2, t_ref + iqr_ref / 2
    if hi < lo_ref:
        return "faster"
    if lo > hi_ref:
        return "slower"
    return "within noise"


def time_note(ratio, verdict=None, emulated=False, low=np.nan, high=np.nan,
              reference: bool = False, iqr_verdict: str | None = None) -> TimeNote:
    """The annotation of one row's step time from its ``time_ratio``, ``time_verdict`` (None/NaN:
    not given), ``emulated`` and noise band; ``reference``: the row the others are divided by;
    ``iqr_verdict``: the verdict from interquartile ranges, for tables without ``time_verdict``."""
    ratio, low, high = nan(ratio), nan(low), nan(high)
    note = _time_note(ratio, verdict, emulated, low, high, reference, iqr_verdict)
    return replace(note, ratio=float(ratio)) if np.isfinite(ratio) and ratio > 0 else note


def _time_note(ratio, verdict, emulated, low, high, reference, iqr_verdict) -> TimeNote:
    verdict = verdict if isinstance(verdict, str) else None
    band = None
    if np.isfinite([ratio, low, high]).all() and ratio > 0:
        band = (low / ratio, high / ratio)
    if _is_true(emulated) or verdict == "emulated":
        return TimeNote(tr("emulated here"), "emulated", True, band)
    if reference and np.isfinite(ratio):  # its verdict against itself says nothing
        return TimeNote(tr("reference"), "reference", False, band)
    if verdict == "not timed" or (np.isnan(ratio) and verdict is None):
        return TimeNote(tr("not timed") if verdict else "", "not timed")
    if verdict is None and band is not None:  # a spread but no verdict: read it from the spread
        verdict = "faster" if high < 1 else ("slower" if low > 1 else "within noise")
    verdict = verdict or iqr_verdict
    if verdict == "faster":
        return TimeNote(tr("{speedup:.2f}x faster", speedup=1 / ratio), verdict, False, band)
    if verdict == "slower":
        return TimeNote(tr("{ratio:.2f}x slower", ratio=ratio), verdict, False, band)
    if verdict == "within noise":
        return TimeNote(tr("≈1x (within noise)"), verdict, False, band)
    if verdict is None:
        return TimeNote(tr("{ratio:.2f}x (noise unknown)", ratio=ratio), "unknown", False, band)
    return TimeNote(tr(verdict), verdict, False, band)  # too few rounds, too small to time, ...


def time_notes(df, reference_rows) -> list[TimeNote]:
    """One `TimeNote` per row of ``df`` (a `compare` table or the dashboard's history);
    ``reference_rows``: per row, the position in ``df`` of the row its ratio is to, or None."""
    ratio, verdict = column(df, "time_ratio"), column(df, "time_verdict", None)
    emulated = column(df, "emulated", False)
    low, high = column(df, "time_ratio_low"), column(df, "time_ratio_high")
    t, iqr = column(df, "step_time_s"), column(df, "step_time_iqr_s")
    notes = []
    for i, ref in enumerate(reference_rows):
        iqr_v = None if ref is None else _verdict_from_iqr(t[i], iqr[i], t[ref], iqr[ref])
        notes.append(time_note(ratio[i], verdict[i], emulated[i], low[i], high[i],
                               reference=ref == i, iqr_verdict=iqr_v))
    return notes


def drawn_heights(heights, notes, reference_rows) -> np.ndarray:
    """The heights to draw: a row with a ratio to a drawn row stands at that row's drawn height × the
    ratio (so bar, label and table agree), the others at their own ``heights`` (ms, NaN where
    none); a chain multiplies. ``notes``: per row, a `TimeNote` or None."""
    h = np.array([nan(v) for v in heights], dtype=float)
    out = h.copy()
    for i, (n, ref) in enumerate(zip(notes, reference_rows)):
        if (n is None or n.ratio is None or n.emulated or ref is None or ref == i
                or not np.isfinite(h[i])):
            continue
        base = out[ref] if ref < i else h[ref]
        if np.isfinite(base) and base > 0 and not (notes[ref] is not None and notes[ref].emulated):
            out[i] = base * n.ratio
    return out


def error_bars(heights, notes) -> np.ndarray | None:
    """``(2, n)`` below/above error bars for bars of ``heights`` from each note's band, or None when
    no row has one."""
    if not any(n.band for n in notes):
        return None
    err = np.zeros((2, len(notes)))
    for i, (h, n) in enumerate(zip(heights, notes)):
        if n.band and np.isfinite(h):
            err[0, i] = max(0.0, h * (1 - n.band[0]))
            err[1, i] = max(0.0, h * (n.band[1] - 1))
    return err


def emulated_caption(labels, t_ms, notes) -> str:
    """The sentence under a chart that leaves emulated step times off its time axis ("" when none
    is): each row whose `TimeNote` is emulated and whose step time (ms) is finite, by its label."""
    parts = [tr("{label} (emulated here)", label=lab) for lab, t, n in zip(labels, t_ms, notes)
             if n is not None and n.emulated and np.isfinite(nan(t))]
    if not parts:
        return ""
    return tr("Not drawn on the time axis: {rows}. Emulated arithmetic is not this hardware's "
              "speed for that precision.", rows="; ".join(parts))
