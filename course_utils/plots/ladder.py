"""Charts of a `course_utils.experiments.compare` table and its relatives: the ladder of
configurations (lesson 03), the live dashboard (`course_utils.dashboard`), the order of adoption.

Step-time ratios are printed only outside the measured noise (`._timing`, docs/method.md#verdict-words).
"""
from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..experiments import plain_label
from ..i18n import tr
from ..step_timing import time_ratio
from ._style import (
    ALERT_COLOR,
    BASELINE_COLOR,
    BREAKDOWN,
    COLORS,
    HATCH,
    MUTED_COLOR,
    TIME_COLOR,
    bucket_name,
    column,
    mib,
    nan,
    new_figure,
    put_caption,
    set_title,
)
from ._timing import (
    TimeNote,
    drawn_heights,
    emulated_caption,
    error_bars,
    not_drawn,
    time_notes,
)

_SAVED = BREAKDOWN[3:]  # activations, autocast weight copies, logits


def _time_bars(ax, x, t_ms, notes: list[TimeNote], colors, refs, fallback_err=None, label=None,
               headroom: float = 1.3) -> None:
    """Step-time bars (ms) annotated by ``notes``, at `._timing.drawn_heights` (``refs``: per row,
    the position of the row its ratio is to); ``fallback_err``: error bars where no note has a band;
    ``label(i, note)``: a bar's label (default: the note's text)."""
    t_ms = drawn_heights(t_ms, notes, refs)
    err = error_bars(t_ms, notes)
    if err is None and fallback_err is not None and np.nansum(fallback_err) > 0:
        err = np.nan_to_num(fallback_err)
    for i, (xi, ti, note) in enumerate(zip(x, t_ms, notes)):
        if not np.isfinite(ti) or note.emulated:  # no bar: say why at its slot
            ax.annotate(not_drawn() if np.isfinite(ti) else tr("not timed"), (xi, 0), xytext=(0, 3),
                        textcoords="offset points", ha="center", va="bottom", fontsize=8,
                        color=MUTED_COLOR)
            continue
        ax.bar(xi, ti, color=colors[i], edgecolor=colors[i], lw=1.2,
               yerr=None if err is None else err[:, i:i + 1], capsize=3,
               error_kw={"ecolor": "black", "elinewidth": 1})
        text = note.text.replace(" (", "\n(") if label is None else label(i, note)
        if text:
            top = ti + (0 if err is None else err[1, i])
            ax.annotate(text, (xi, top), xytext=(0, 3),
                        textcoords="offset points", ha="center", va="bottom", fontsize=8,
                        color=MUTED_COLOR if note.verdict in ("reference", "not timed") else "black")
    drawn = np.array([np.nan if n.emulated else v for v, n in zip(t_ms, notes)], dtype=float)
    top = np.nanmax(np.append(drawn + (0 if err is None else err[1]), 0))
    ax.set_ylim(0, top * headroom if top > 0 else 1)


def _caption(fig, labels, t_ms, notes) -> None:
    """Say under ``fig`` which emulated times its time axis leaves out."""
    text = emulated_caption(labels, t_ms, notes)
    if text:
        put_caption(fig, text)


def comparison_chart(df, title: str = "", size: str | None = None):
    """Three panels for a `course_utils.experiments.compare` table, one bar per configuration (in
    words, `course_utils.experiments.plain_label`): step time (ms, the first row's median × each
    ``time_ratio``, whiskers × its noise band, labelled only outside the noise; tables without a
    ratio: own medians and IQRs), peak allocated memory and saved tensors by kind (MiB, the
    estimate as a black tick). Without two rows timed natively the time panel is left out and the
    title says so. Raises ValueError for a table without rows."""
    if len(df) == 0:
        raise ValueError(tr("comparison_chart() needs at least one row (a compare() table)."))
    labels, n = [plain_label(v) for v in df["label"]], len(df)
    x = np.arange(n)
    notes = time_notes(df, [0] * n)
    t = np.array([nan(v) * 1e3 for v in df["step_time_s"]])
    timed = sum(1 for v, note in zip(t, notes) if not np.isnan(v) and not note.emulated) >= 2
    fig = new_figure((max(10, 2.2 * n + 6) * (1 if timed else 0.7), 4.9))
    if timed:
        ax_t, ax_p, ax_s = fig.subplots(1, 3)
        iqr = np.array([nan(v) * 1e3 / 2 for v in df["step_time_iqr_s"]])
        _time_bars(ax_t, x, t, notes, [TIME_COLOR] * n, [0] * n, np.vstack([iqr, iqr]))
        ax_t.set_ylabel(tr("step time (ms)"))
        ax_t.set_title(tr("step time"), fontsize=10)
    else:
        ax_p, ax_s = fig.subplots(1, 2)
        title = tr("{title} (step time not drawn: only one configuration runs natively here)",
                   title=title)

    ax_p.bar(x, mib(df["peak_allocated"]), color=COLORS["parameters"])
    ax_p.scatter(x, mib(df["est_peak_allocated"]), marker="_", s=600, color="black",
                 linewidths=2, zorder=3)
    ax_p.set_ylabel("MiB")
    ax_p.set_title(tr("peak allocated memory"), fontsize=10)

    bottom = np.zeros(n)
    for kind in _SAVED:
        vals = np.nan_to_num(mib(df[kind]))
        ax_s.bar(x, vals, bottom=bottom, color=COLORS[kind])
        bottom = bottom + vals
    ax_s.scatter(x, mib(df["est_saved_total"]), marker="_", s=600, color="black", linewidths=2,
                 zorder=3)
    ax_s.set_ylabel("MiB")
    ax_s.set_title(tr("saved tensors (for backward)"), fontsize=10)
    for ax in ((ax_t, ax_p, ax_s) if timed else (ax_p, ax_s)):
        ax.set_xticks(x, [textwrap.fill(lab, 20) for lab in labels], rotation=30, ha="right",
                      fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    ax_p.margins(y=0.1)
    ax_s.margins(y=0.1)
    handles = [Patch(color=COLORS["parameters"], label=tr("peak allocated (measured)"))]
    handles += [Patch(color=COLORS[k], label=tr("saved: {bucket}", bucket=bucket_name(k)))
                for k in _SAVED]
    handles.append(Line2D([], [], color="black", lw=2, label=tr("estimate")))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6), fontsize=8,
               frameon=False)
    _caption(fig, labels, t, notes)
    set_title(fig, title, size)
    return fig


def _dashboard_references(df) -> list:
    """For each history row, the position of its baseline row in ``df`` (None if absent)."""
    runs = list(df["run"]) if "run" in df.columns else list(range(len(df)))
    pos = {r: i for i, r in enumerate(runs)}
    refs, last_base = [], None
    for i, (is_base, base_run) in enumerate(zip(df["baseline"], column(df, "baseline_run", None))):
        if is_base:
            last_base = i
        refs.append(last_base if is_base or np.isnan(nan(base_run)) else pos.get(base_run))
    return refs


def dashboard_chart(df, last: int = 10, title: str = "", size: str | None = None):
    """The live dashboard's chart of the last ``last`` rows of `Dashboard.history`: step time (ms,
    baselines grey, ratios to the Run's baseline only outside the noise) and the memory breakdown
    (MiB) with the peak as a tick and its ratio; failed rows marked. Raises ValueError for no rows."""
    if len(df) == 0:
        raise ValueError(tr("dashboard_chart() needs at least one run in the history."))
    refs = _dashboard_references(df)
    keep = len(df) - min(last, len(df))
    notes = time_notes(df, refs)[keep:]
    df = df.iloc[keep:]
    n = len(df)
    x = np.arange(n)
    base = tr("(base)")
    labels = [f"#{r.run} {r.label}{' ' + base if r.baseline else ''}\n"
              f"b{r.batch_size} s{r.seq_len} L{r.n_layers}" for r in df.itertuples()]
    fig = new_figure((max(9.0, 1.3 * n + 5.5), 4.6))
    ax_t, ax_m = fig.subplots(1, 2)
    ok = [s == "ok" for s in df["status"]]
    t = np.array([nan(v) * 1e3 if good else np.nan for v, good in zip(df["step_time_s"], ok)])
    colors = [BASELINE_COLOR if b else TIME_COLOR for b in df["baseline"]]
    shown_refs = [None if r is None or r < keep else r - keep for r in refs[keep:]]
    _time_bars(ax_t, x, t, [nt if good else TimeNote("", "failed") for nt, good in zip(notes, ok)],
               colors, shown_refs)
    for xi, status in zip(x, df["status"]):
        if status != "ok":
            for ax in (ax_t, ax_m):
                ax.annotate(tr("error") if status == "error" else status, (xi, 0),
                            xytext=(0, 3), textcoords="offset points", ha="center",
                            color=ALERT_COLOR, fontsize=9, fontweight="bold")
    ax_t.set_ylabel(tr("step time (ms)"))
    ax_t.set_title(tr("step time (ratio to the baseline, where outside the noise)"), fontsize=10)
    _caption(fig, labels, t, notes)

    bottom = np.zeros(n)
    for kind in BREAKDOWN:
        vals = np.nan_to_num(mib(df[kind]))
        ax_m.bar(x, vals, bottom=bottom, color=COLORS[kind], label=bucket_name(kind))
        bottom = bottom + vals
    peak = mib(df["peak_allocated"])
    ax_m.scatter(x, peak, marker="_", s=500, color="black", linewidths=2,
                 label=tr("peak allocated"), zorder=3)
    for xi, pk, ratio, good in zip(x, peak, df["peak_ratio"], ok):
        if good and not np.isnan(nan(ratio)) and not np.isnan(pk):
            ax_m.annotate(f"{ratio:.2f}x", (xi, max(pk, bottom[xi])), xytext=(0, 3),
                          textcoords="offset points", ha="center", fontsize=8)
    ax_m.set_ylabel("MiB")
    ax_m.set_title(tr("memory breakdown (peak ratio to the baseline)"), fontsize=10)
    ax_m.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax_m.set_ylim(0, np.nanmax(np.append(np.append(peak, bottom), 1e-9)) * 1.18)
    for ax in (ax_t, ax_m):
        ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    set_title(fig, title, size)
    return fig


def _adoption_label(note: str, vs, estimate: bool) -> str:
    """A bar's label: its ratio (or verdict) and the name of the bar the ratio is to."""
    text = note.replace(" (", "\n(") if note else ""
    if vs and note and note not in (tr("reference"), tr("not timed")):
        text += "\n" + tr("vs {step}", step=str(vs).removeprefix("+ "))
    return (text + ("\n" + tr("(estimate)") if estimate else "")).strip()


def _adoption_peaks(ax, story, vs) -> None:
    """The peak-memory panel of `adoption_chart`."""
    color = COLORS["parameters"]
    vals = mib(story["peak_allocated"])
    for xi, v, ratio, ref_name, src in zip(np.arange(len(story)), vals, story["peak_ratio"], vs,
                                           story["source"]):
        if not np.isfinite(v):
            continue
        est = src == "estimate"
        ax.bar(xi, v, color="white" if est else color, edgecolor=color,
               hatch=HATCH if est else None, lw=1.2)
        note = f"{nan(ratio):.2f}x" if np.isfinite(nan(ratio)) else ""
        label = _adoption_label(note, ref_name, est)
        if label:
            ax.annotate(label, (xi, v), xytext=(0, 3), textcoords="offset points",
                        ha="center", fontsize=8)
    ax.set_ylim(0, np.nanmax(np.append(vals, 1.0)) * 1.35)
    ax.set_ylabel(tr("peak allocated (MiB)"))
    ax.set_title(tr("peak allocated memory"), fontsize=10)


def adoption_chart(story, title: str = "", size: str | None = None):
    """The order of adoption: step time (ms) and peak memory (MiB) after each step of ``story``
    (`adoption_story`'s table); every ratio names the bar it is to (``vs``), a time stands at that
    bar's height × the ratio; estimates are hatched. Raises ValueError for an empty ``story`` or a
    table without `adoption_story`'s columns."""
    if len(story) == 0:
        raise ValueError(tr("adoption_chart() needs at least one step."))
    missing = {"step", "step_time_s", "peak_allocated", "source", "vs", "peak_ratio"} - set(story)
    if missing:
        raise ValueError(tr("adoption_chart() needs adoption_story()'s table; missing {columns}.",
                            columns=sorted(missing)))
    names = list(story["step"])
    vs = [v if isinstance(v, str) else None for v in story["vs"]]   # pandas may hold None as NaN
    refs = [None if v is None else names.index(v) for v in vs]
    refs = [i if r is None and np.isfinite(nan(t)) else r
            for i, (r, t) in enumerate(zip(refs, story["step_time_s"]))]
    fig = new_figure((12, 4.6))
    axes = fig.subplots(1, 2)
    notes = time_notes(story, refs)
    t = [nan(v) * 1e3 for v in story["step_time_s"]]
    _time_bars(axes[0], np.arange(len(story)), t, notes, [TIME_COLOR] * len(story), refs,
               label=lambda i, note: _adoption_label(note.text, vs[i], False), headroom=1.35)
    axes[0].set_ylabel(tr("step time (ms)"))
    axes[0].set_title(tr("step time"), fontsize=10)
    _adoption_peaks(axes[1], story, vs)
    for ax in axes:
        ax.set_xticks(np.arange(len(story)), names, rotation=20, ha="right", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    _caption(fig, names, t, notes)
    set_title(fig, title, size)
    return fig


def _story_row(name, table, i, ref, vs) -> dict:
    """One measured step of `adoption_story`: row ``i`` of ``table``, against row ``ref``."""
    row = table.iloc[i]
    emulated = bool(row["emulated"])
    ratio, verdict, low, high, peak_ratio = np.nan, "reference", np.nan, np.nan, np.nan
    ms = table.attrs.get("measurements")
    if ref is not None:
        peak_ratio = nan(row["peak_allocated"]) / nan(table.iloc[ref]["peak_allocated"])
        if ms is not None:
            a, b = ms[i], ms[ref]   # through the first row, as the ladder's table prints it
            r = time_ratio(a.step_times_s, b.step_times_s, size=table.attrs.get("size", ""),
                           emulated=a.emulated or b.emulated,
                           through=None if ms[0].emulated else ms[0].step_times_s)
            ratio, low, high, verdict = nan(r.ratio), nan(r.low), nan(r.high), r.verdict
    paired = row.get("paired_step_time_s", np.nan)   # the time the ladder's table prints
    step_s = row["step_time_s"] if paired is None or pd.isna(paired) else paired
    return {"step": name, "step_time_s": step_s, "peak_allocated": row["peak_allocated"],
            "source": "measured", "adopted": not emulated, "emulated": emulated, "vs": vs,
            "time_ratio": ratio, "time_verdict": verdict, "time_ratio_low": low,
            "time_ratio_high": high, "peak_ratio": peak_ratio}


def adoption_story(df, steps, estimates=()):
    """The table `adoption_chart` draws, read off `course_utils.experiments.compare` tables.

    Args:
        df: a `compare` table (its ``attrs["measurements"]`` hold the per-round step times).
        steps: ``[(name, label)]`` or ``[(name, label, table)]`` in the order of adoption:
            ``label`` names a row of ``df`` (or of ``table``, another `compare` table); a step
            whose label is None was not measured here and is left out.
        estimates: ``[(name, peak bytes)]``: estimated steps appended at the end (no time).

    Each measured step is compared with (``vs``) the last adopted step measured in the same table
    (an emulated step is shown, not adopted); the first step of another table with that table's
    row of an earlier adopted step. An estimate's ``vs`` is the last step shown.

    Returns:
        One row per step shown: ``step``, ``step_time_s``, ``peak_allocated``, ``source``
        (``measured`` or ``estimate``), ``adopted``, ``emulated``, ``vs``, ``peak_ratio`` and
        ``time_ratio``, ``time_verdict``, ``time_ratio_low``, ``time_ratio_high`` against ``vs``.

    Raises:
        ValueError: no steps, or a label that is not a row of its table."""
    if not steps:
        raise ValueError(tr("adoption_story() needs at least one step."))
    rows, last, adopted = [], {}, {}  # last: id(table) -> (row, step) of its last adopted step
    for step in steps:
        name, label, table = (*step, df) if len(step) == 2 else step
        if label is None:
            continue
        labels = list(table["label"])
        if label not in labels:
            raise ValueError(tr("no row {label!r} in this table: its rows are {labels}.",
                                label=label, labels=labels))
        i = labels.index(label)
        ref, vs = last.get(id(table), (None, None))
        if ref is None:  # first from this table: against its row of an earlier adopted step
            ref, vs = next(((j, adopted[lab]) for j, lab in enumerate(labels)
                            if lab in adopted and j != i), (None, None))
        rows.append(_story_row(name, table, i, ref, vs))
        if rows[-1]["adopted"] and np.isfinite(nan(rows[-1]["step_time_s"])):
            last[id(table)], adopted[label] = (i, name), name
    for name, peak in estimates:
        prev = rows[-1] if rows else None
        rows.append({"step": name, "step_time_s": np.nan, "peak_allocated": peak,
                     "source": "estimate", "adopted": True, "emulated": False,
                     "vs": None if prev is None else prev["step"], "time_ratio": np.nan,
                     "time_verdict": None, "time_ratio_low": np.nan, "time_ratio_high": np.nan,
                     "peak_ratio": np.nan if prev is None else peak / nan(prev["peak_allocated"])})
    return pd.DataFrame(rows)
