"""What a chart may say about a step-time ratio: the ratio only outside the measured noise.

`course_utils.experiments.compare` gives each row ``time_ratio`` (median step-time ratio to the
reference row), its spread ``time_ratio_low`` / ``time_ratio_high``, a ``time_verdict`` (one of
`course_utils.step_timing.VERDICTS`) and ``emulated`` (the precision is emulated on this
hardware: its time is not the speed of real hardware). Older tables lack these columns; then
the verdict is read from the interquartile ranges (``step_time_iqr_s``) when both rows have
one, else the ratio is printed with "(noise unknown)".

A bar and its whisker say what its label says: a row whose ratio is to a drawn reference bar
stands at the reference's height × the ratio, and its whisker spans the reference's height ×
(low, high), so the whisker reaches the reference bar exactly when the label says "within
noise" (`drawn_heights`, `error_bars`). The ratio is the median of per-round ratios, which can
differ from the ratio of two median step times; the noise band always reaches the latter.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..i18n import tr
from ..step_timing import TOO_SMALL
from ._style import column, nan

#: What a bar says for each verdict that is not a ratio (too few rounds and too small to time
#: say their verdict), in English; a `TimeNote`'s text is in the learner's language.
WITHIN_NOISE, EMULATED, NOT_TIMED = "≈1x (within noise)", "emulated here", "not timed"
#: What stands where an emulated time would be: emulated times are never drawn on a time axis
#: (`not_drawn` gives it in the learner's language).
NOT_DRAWN = "emulated:\nnot drawn"


def not_drawn() -> str:
    """`NOT_DRAWN` in the learner's language."""
    return tr("emulated:\nnot drawn")


def verdict_text(verdict: str) -> str:
    """A verdict word (`course_utils.step_timing.VERDICTS`) as a chart shows it, in the learner's
    language; the constant itself stays English (code compares it)."""
    return tr(verdict)


@dataclass(frozen=True)
class TimeNote:
    """The annotation of one row's step time.

    Attributes:
        text: what to print by the bar (one line; "" for nothing), in the learner's language.
        verdict: the verdict it stands for (`course_utils.step_timing.VERDICTS`, or
            ``"reference"``/``"unknown"``).
        emulated: draw the bar hatched and say "emulated here".
        band: ``(low, high)`` of the ratio's spread relative to the ratio itself (multiply the
            bar by them for its error bar), or None.
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
    """Old tables: disjoint interquartile ranges -> faster/slower, overlapping -> within noise,
    no spread measured (one timed step gives an IQR of 0) -> None."""
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
    """The annotation of one step time (see the module's docstring).

    Args:
        ratio: step time / the reference row's (``time_ratio``).
        verdict: ``time_verdict`` (None/NaN: not given).
        emulated: ``emulated``.
        low, high: ``time_ratio_low`` / ``time_ratio_high``.
        reference: this row is the one the others are divided by (says "reference").
        iqr_verdict: the verdict from interquartile ranges, for tables without ``time_verdict``.
    """
    ratio, low, high = nan(ratio), nan(low), nan(high)
    note = _time_note(ratio, verdict, emulated, low, high, reference, iqr_verdict)
    if np.isfinite(ratio) and ratio > 0:
        note = TimeNote(note.text, note.verdict, note.emulated, note.band, float(ratio))
    return note


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
    if verdict == TOO_SMALL:
        return TimeNote(tr("too small to time"), verdict, False, band)
    if verdict == "too few rounds":
        return TimeNote(tr("too few rounds"), verdict, False, band)
    if verdict is None:
        return TimeNote(tr("{ratio:.2f}x (noise unknown)", ratio=ratio), "unknown", False, band)
    return TimeNote(verdict_text(verdict), verdict, False, band)  # a verdict not known here yet


def time_notes(df, reference_rows) -> list[TimeNote]:
    """One `TimeNote` per row of ``df`` (a `compare` table or the dashboard's history).

    Args:
        df: reads ``time_ratio`` and, where present, ``time_verdict``, ``emulated``,
            ``time_ratio_low``, ``time_ratio_high``, ``step_time_s``, ``step_time_iqr_s``.
        reference_rows: for each row, the position (in ``df``) of the row its ratio is to, or
            None where that row is not in ``df``.
    """
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
    """The heights to draw: a row whose note has a ratio to a drawn row of ``heights`` stands
    at that row's drawn height × the ratio (so bar, label and table's ``ref × ratio`` agree);
    the reference rows, rows without a ratio and rows whose reference is not drawn keep their
    own height. Rows are taken in order, so a chain (each step against the previous) multiplies.

    Args:
        heights: per row, its own value (a median step time, ms), NaN where none.
        notes: per row, its `TimeNote` (or None).
        reference_rows: per row, the position of the row its ratio is to, or None.
    """
    h = np.array([nan(v) for v in heights], dtype=float)
    out = h.copy()
    for i, (n, ref) in enumerate(zip(notes, reference_rows)):
        if (n is None or n.ratio is None or n.emulated or ref is None or ref == i
                or not np.isfinite(h[i])):
            continue
        base = out[ref] if ref < i else h[ref]
        ref_note = notes[ref]
        if np.isfinite(base) and base > 0 and not (ref_note is not None and ref_note.emulated):
            out[i] = base * n.ratio
    return out


def error_bars(heights, notes) -> np.ndarray | None:
    """``(2, n)`` below/above error bars for bars of ``heights`` from each note's ratio spread,
    or None when no row has one. With heights from `drawn_heights`, a row's whisker spans its
    reference's height × (low, high)."""
    if not any(n.band for n in notes):
        return None
    err = np.zeros((2, len(notes)))
    for i, (h, n) in enumerate(zip(heights, notes)):
        if n.band and np.isfinite(h):
            err[0, i] = max(0.0, h * (1 - n.band[0]))
            err[1, i] = max(0.0, h * (n.band[1] - 1))
    return err


def emulated_caption(labels, t_ms, notes, reference_ms=None) -> str:
    """The sentence under a chart that leaves emulated step times off its time axis:
    ``"Not drawn on the time axis: bf16 (emulated here). Emulated arithmetic is not this
    hardware's speed for that precision."`` ("" when nothing is emulated). The emulated time
    itself is not repeated here: a table prints it once, rounded (issue 24).

    Args:
        labels, t_ms, notes: per row, its name, step time (ms) and `TimeNote`; a row is named
            when its note is emulated and it has a time.
        reference_ms: unused (kept for callers that pass the row the ratio is to).
    """
    parts = [tr("{label} (emulated here)", label=lab) for lab, t, n in zip(labels, t_ms, notes)
             if n is not None and n.emulated and np.isfinite(nan(t))]
    if not parts:
        return ""
    return tr("Not drawn on the time axis: {rows}. Emulated arithmetic is not this hardware's "
              "speed for that precision.", rows="; ".join(parts))
