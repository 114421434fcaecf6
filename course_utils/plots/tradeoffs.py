"""What memory buys and what it costs: the Pareto front of step time against peak memory, the
largest micro-batch under a memory budget, the race of the configurations at those batches, and
the routes that fit a model's fine-tuning on one GPU.
"""
from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.lines import Line2D

from ..experiments import _per_token, plain_label
from ..i18n import tr
from ..memory_model import _moment_words
from ..step_timing import time_ratio
from ..terms import MiB
from ._style import (
    ALERT_COLOR,
    COLORS,
    HATCH,
    MUTED_COLOR,
    SERIES,
    TIME_COLOR,
    mib,
    nan,
    new_figure,
    place_point_labels,
    put_caption,
    set_title,
    with_size,
)
from ._timing import emulated_caption, not_drawn, time_note, time_notes


def _tied(notes, bands, i: int, j: int, rounds=None, size: str = "") -> bool:
    """Rows ``i`` and ``j`` take the same time within the noise: by their own per-round ratio where
    ``rounds`` (each row's step times, same rounds) are given, else both within noise of the first
    row or their noise bands ``bands[i]`` (to the first row, or None) overlapping."""
    a, b = notes[i], notes[j]
    if a is None or b is None:
        return False
    if rounds is not None:
        return time_ratio(rounds[i], rounds[j], size=size).verdict not in ("faster", "slower")
    if {a.verdict, b.verdict} <= {"within noise", "reference"}:
        return True
    return bool(bands[i] and bands[j] and bands[i][0] <= bands[j][1]
                and bands[j][0] <= bands[i][1])


def _paired_rounds(df) -> list | None:
    """The step times (seconds) of `compare`'s measurements (``df.attrs["measurements"]``) when
    every row was timed in the same rounds, else None."""
    ms = df.attrs.get("measurements")
    if not ms or len(ms) != len(df):
        return None
    times = [list(getattr(m, "step_times_s", []) or []) for m in ms]
    return times if len({len(t) for t in times}) == 1 and len(times[0]) >= 2 else None


def pareto_chart(df, title: str = "step time vs peak memory", size: str | None = None):
    """Each configuration of a `course_utils.experiments.compare` table as a point (step time in ms,
    as `course_utils.experiments.summary` prints it; peak allocated memory in MiB), the Pareto
    front joined by a line: no other configuration has a lower peak at a step time at least as
    short, times within the noise of each other (`_tied`) counting as a tie (tied neighbours joined
    by a dotted line). Each point is labelled in words with its time ratio to the first row only
    outside the noise; horizontal error bars show the ratio's spread, else the IQR. Emulated rows
    are not drawn: a caption names them. Raises ValueError when no row has both a step time and a
    peak, timed natively."""
    own = [nan(v) for v in df["step_time_s"]]
    paired = [nan(v) for v in df.get("paired_step_time_s", [np.nan] * len(df))]
    t = np.array([(p if np.isfinite(p) else o) * 1e3 for p, o in zip(paired, own)])
    iqr = np.array([nan(v) * 1e3 / 2 for v in df["step_time_iqr_s"]])
    peak = mib(df["peak_allocated"])
    plain = df["checkpoint"] if "checkpoint" in df.columns else [None] * len(df)
    labels = [tr("{config} (no checkpointing)", config=plain_label(lab)) if ck == "none"
              else plain_label(lab) for lab, ck in zip(df["label"], plain)]
    notes = time_notes(df, [0] * len(df)) if "time_ratio" in df.columns else [None] * len(df)
    emulated = np.array([bool(n and n.emulated) for n in notes], dtype=bool)
    ok = ~(np.isnan(t) | np.isnan(peak)) & ~emulated
    if not ok.any():
        raise ValueError(tr("pareto_chart needs rows with a step time and a peak, timed natively."))
    low, high = (np.array([nan(v) for v in df.get(c, [np.nan] * len(df))])
                 for c in ("time_ratio_low", "time_ratio_high"))
    bands = [(lo, hi) if np.isfinite([lo, hi]).all() else None for lo, hi in zip(low, high)]
    fig = new_figure((8, 5))
    ax = fig.subplots()
    err, bars = _pareto_error_bars(t, iqr, ok, notes, labels[0])
    ax.errorbar(t[ok], peak[ok], xerr=None if err is None else err[:, ok], fmt="o",
                color=TIME_COLOR, ecolor="#9bb0d6", capsize=3, markersize=7, zorder=3)
    texts = []
    for i in np.flatnonzero(ok):
        note = notes[i]
        text = labels[i] if note is None or not note.text else f"{labels[i]}: {note.text}"
        texts.append(ax.annotate(text, (t[i], peak[i]), xytext=(6, 5), textcoords="offset points",
                                 fontsize=8))

    rounds, size_of_rounds = _paired_rounds(df), df.attrs.get("size", "")

    def tied(i, j):
        return _tied(notes, bands, i, j, rounds, size_of_rounds)
    handles = _draw_front(ax, t, peak, _front(t, peak, ok, tied), tied, err is not None, bars)
    ax.set_xlabel(tr("step time (ms)"))
    ax.set_ylabel(tr("peak allocated memory (MiB)"))
    ax.set_title(with_size(title, size))
    below, above = np.zeros((2, len(t))) if err is None else err
    lo, hi = np.nanmin(t[ok] - below[ok]), np.nanmax(t[ok] + above[ok])
    pad = 0.08 * (hi - lo) + 0.02 * hi
    ax.set_xlim(lo - pad, hi + 4 * pad)
    ax.set_ylim(0, np.nanmax(peak[ok]) * 1.25)
    ax.grid(alpha=0.3)
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    caption = emulated_caption(labels, t, notes)
    if caption:
        put_caption(fig, caption, width=110)
    place_point_labels(fig, ax, texts, points=[(t[i], peak[i], t[i] - below[i], t[i] + above[i])
                                               for i in np.flatnonzero(ok)])
    return fig


def _pareto_error_bars(t, iqr, ok, notes, first: str):
    """The horizontal error bars of `pareto_chart` (a 2 x n array, or None) and what they show:
    the spread of each ratio to the first row where measured, else the interquartile range."""
    if any(n and n.band for n in notes):
        err = np.zeros((2, len(t)))
        for i, n in enumerate(notes):
            if n and n.band and np.isfinite(t[i]):
                err[:, i] = (t[i] * (1 - n.band[0]), t[i] * (n.band[1] - 1))
        return err, tr("bars: spread of the time ratio to {config}", config=first)
    if np.nansum(iqr[ok]) > 0:
        return np.vstack([np.nan_to_num(iqr)] * 2), tr("bars: interquartile range")
    return None, tr("no spread measured")


def _front(t, peak, ok, tied) -> list[int]:
    """The rows on the Pareto front, by step time: no other row is as small or smaller at a time as
    short (``tied(i, j)``: times within the noise of each other count as the same)."""
    def faster(j, i):  # j is faster than i, outside the noise
        return t[j] < t[i] and not tied(i, j)

    def dominates(j, i):
        same_time = tied(i, j) or t[j] == t[i]
        return ((faster(j, i) or same_time) and peak[j] <= peak[i]
                and (faster(j, i) or peak[j] < peak[i]))

    idx = [i for i in np.flatnonzero(ok) if not any(dominates(j, i) for j in np.flatnonzero(ok))]
    return sorted(idx, key=lambda i: t[i])


def _draw_front(ax, t, peak, idx, tied, has_err: bool, bars: str) -> list:
    """Draw the front through the rows ``idx`` (a tie between neighbours dotted); return the
    legend's handles: the front, the points and their bars, and the tie where one is drawn."""
    front = tr("Pareto front: no other policy is smaller at a step time as short")
    ring = dict(marker="o", markersize=12, markerfacecolor="none", markeredgewidth=1.5)  # a front
    ax.plot(t[idx], peak[idx], "-", color="#DD8452", zorder=2, label=tr("Pareto front"), **ring)
    handles = [Line2D([], [], color="#DD8452", label=front, **ring),  # of one point shows too
               Line2D([], [], color="#9bb0d6" if has_err else TIME_COLOR, marker="o",
                      markerfacecolor=TIME_COLOR, markeredgecolor=TIME_COLOR, label=bars)]
    ties = [(a, b) for a, b in zip(idx, idx[1:]) if tied(a, b)]
    for a, b in ties:  # a tie: the segment drawn dotted (white under it hides the solid line)
        ax.plot(t[[a, b]], peak[[a, b]], "-", color="white", lw=3, zorder=2.1)
        ax.plot(t[[a, b]], peak[[a, b]], ":", color="#DD8452", lw=1.5, zorder=2.2)
    if ties:
        handles.append(Line2D([], [], color="#DD8452", ls=":",
                              label=tr("tie: times within the noise of each other")))
    return handles


def budget_chart(searches, title: str = "", size: str | None = None):
    """Peak allocated memory (MiB) against micro-batch, one colour per `course_utils.search.BatchSearch`
    of ``searches``: each measured batch a dot (x: over the budget), the estimate dashed, the budget
    a red line. Memory only: the search times no step worth comparing (`race_chart` does). Raises
    ValueError for no searches."""
    if not searches:
        raise ValueError(tr("budget_chart() needs at least one BatchSearch."))
    fig = new_figure((8, 5.0))
    ax_m = fig.subplots()
    budget = searches[0].budget_bytes / MiB
    handles = []
    for i, s in enumerate(searches):
        c = SERIES[i % len(SERIES)]
        if s.estimated:
            eb, ev = zip(*s.estimated)
            ax_m.plot(eb, mib(ev), "--", color=c, alpha=0.6, lw=1)
        for p in sorted(s.probes, key=lambda p: p.batch_size):
            if p.peak_allocated is not None:
                ax_m.scatter(p.batch_size, p.peak_allocated / MiB, color=c, zorder=3, s=40,
                             marker="o" if p.fits else "x")
        handles.append(Line2D([], [], color=c, marker="o",
                              label=tr("{config}: largest batch {batch}",
                                       config=plain_label(s.label), batch=s.batch_size)))
    ax_m.axhline(budget, color=ALERT_COLOR, lw=1.5)
    handles += [Line2D([], [], color=ALERT_COLOR, lw=1.5,
                       label=tr("budget {budget:,.1f} MiB", budget=budget)),
                Line2D([], [], color="grey", ls="--", lw=1, label=tr("estimate")),
                Line2D([], [], color="grey", marker="x", ls="", label=tr("over budget"))]
    ax_m.set_xlabel(tr("micro-batch (sequences)"))
    ax_m.set_ylabel(tr("peak allocated (MiB)"))
    ax_m.set_ylim(0, max(budget, ax_m.get_ylim()[1]) * 1.08)
    ax_m.grid(alpha=0.3)
    ax_m.xaxis.get_major_locator().set_params(integer=True)
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    set_title(fig, title, size)
    return fig


def race_chart(race, title: str = "", size: str | None = None):
    """Tokens per second of each configuration of a `course_utils.search.Race` at its largest
    micro-batch under the budget: the first bar at its own tokens/s, each other at the first's / its
    time-per-token ratio to it (whiskers / that ratio's noise band), labelled with the ratio only
    outside the noise. Emulated configurations are not drawn (the caption names them). Raises
    ValueError for a race without rows."""
    df = race.table
    if len(df) == 0:
        raise ValueError(tr("race_chart() needs a race with at least one configuration."))
    n = len(df)
    tokens = [int(b) * int(a) for b, a in zip(df["batch_size"], df["grad_accum_steps"])]
    ratio, low, high, verdicts = _per_token(*(list(df[c]) if c in df else [None] * n for c in (
        "time_ratio", "time_ratio_low", "time_ratio_high", "time_verdict")), tokens)
    emulated = [bool(v) for v in df["emulated"]] if "emulated" in df else [False] * n
    notes = [time_note(r, v, e, lo, hi, reference=i == 0)
             for i, (r, v, e, lo, hi) in enumerate(zip(ratio, verdicts, emulated, low, high))]
    tps = np.array([nan(v) for v in df["tokens_per_s"]], dtype=float)
    labels = [f"{textwrap.fill(plain_label(lab), 18)}\n" + tr("micro-batch {batch}", batch=b)
              for lab, b in zip(df["label"], df["batch_size"])]
    fig = new_figure((max(7.0, 2.4 * n + 2.5), 4.8))
    ax = fig.subplots()
    x = np.arange(n)
    top = 0.0
    ref = tps[0] if n and np.isfinite(tps[0]) and not notes[0].emulated else np.nan
    for i, note in enumerate(notes):      # tokens/s = the first bar's / the time-per-token ratio
        if i and np.isfinite(ref) and note.ratio and not note.emulated and np.isfinite(tps[i]):
            tps[i] = ref / note.ratio
    for i, (xi, h, note) in enumerate(zip(x, tps, notes)):
        if not np.isfinite(h):
            continue
        if note.emulated:
            ax.annotate(not_drawn(), (xi, 0), xytext=(0, 3), textcoords="offset points",
                        ha="center", va="bottom", fontsize=8, color=MUTED_COLOR)
            continue
        err = None
        if note.band:   # a time-per-token band (b0, b1) is a tokens/s band (1/b1, 1/b0)
            err = [[max(0.0, h - h / note.band[1])], [max(0.0, h / note.band[0] - h)]]
        ax.bar(xi, h, color=TIME_COLOR, yerr=err, capsize=3,
               error_kw={"ecolor": "black", "elinewidth": 1})
        end = h + (err[1][0] if err else 0)
        top = max(top, end)
        text = tr("reference") if i == 0 else note.text
        if i and text and np.isfinite(ref) and note.ratio:   # the bar the ratio is to, by name
            text += "\n" + tr("vs {step}", step=plain_label(df['label'].iloc[0]))
        if text:
            ax.annotate(text.replace(" (", "\n("), (xi, end), xytext=(0, 3),
                        textcoords="offset points", ha="center", va="bottom", fontsize=8,
                        color=MUTED_COLOR if note.verdict in ("reference", "not timed") else "black")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel(tr("tokens/s"))
    ax.set_ylim(0, top * 1.3 if top > 0 else 1)
    ax.grid(axis="y", alpha=0.3)
    caption = emulated_caption([lab.replace("\n", " ") for lab in labels],
                               [1e3 * t for t in df["step_time_s"]], notes)
    if caption:
        put_caption(fig, caption, width=110)
    set_title(fig, title, size)
    return fig


def routes_chart(routes, gpu_gib: float = 24.0, title: str = "", size: str | None = None):
    """Fine-tuning routes of `course_utils.lora.routes`' table, estimated: one hatched bar per route,
    the peak of a step (GiB) stacked by what is alive at that moment
    (`course_utils.memory_model.PEAK_PARTS`), with its moment and whether it fits ``gpu_gib`` (GiB,
    a dashed red line). Raises ValueError for no routes, a table without the parts alive at the
    peak, or a non-positive ``gpu_gib``."""
    if len(routes) == 0:
        raise ValueError(tr("routes_chart() needs at least one route (course_utils.lora.routes())."))
    parts = [c.removeprefix("at peak: ") for c in routes.columns if c.startswith("at peak: ")]
    if not parts:
        raise ValueError(tr("routes_chart() needs course_utils.lora.routes()'s table (the parts "
                            "alive at the peak)."))
    if not gpu_gib > 0:
        raise ValueError(tr("gpu_gib must be > 0, got {gpu_gib!r}.", gpu_gib=gpu_gib))
    n = len(routes)
    fig = new_figure((11, 1.4 + 0.6 * n))
    ax = fig.subplots()
    y = np.arange(n)[::-1]
    left = np.zeros(n)
    colors = {"weights": COLORS["parameters"], "AdamW state": COLORS["optimizer_state"],
              "gradients": COLORS["gradients"], "saved tensors": COLORS["activations"],
              "temporaries": COLORS["autocast_weight_copies"]}
    for part in parts:
        vals = routes[f"at peak: {part}"].to_numpy(dtype=float)
        ax.barh(y, vals, left=left, color="white", edgecolor=colors.get(part, MUTED_COLOR), hatch=HATCH,
                label=tr(part), height=0.6)
        left = left + vals
    peak = routes["peak"].to_numpy(dtype=float)
    for yi, pk, end, fits, at in zip(y, peak, left, routes["fits"], routes["peak at"]):
        moment = _moment_words(at)       # "the start of backward (later micro-batch)", translated
        ax.annotate(tr("peak {peak:,.1f} GiB, at {moment}: fits", peak=pk, moment=moment)
                    if fits else
                    tr("peak {peak:,.1f} GiB, at {moment}: does not fit", peak=pk, moment=moment),
                    (max(pk, end), yi), xytext=(6, 0), textcoords="offset points",
                    va="center", fontsize=8, color="black" if fits else ALERT_COLOR)
    ax.axvline(gpu_gib, color=ALERT_COLOR, ls="--", lw=1)
    ax.annotate(tr("{gib:g} GiB GPU", gib=gpu_gib), (gpu_gib, n - 0.45), ha="center", va="bottom",
                fontsize=8, color=ALERT_COLOR, annotation_clip=False)
    ax.set_yticks(y, routes["route"], fontsize=9)
    ax.set_xlim(0, max(peak.max(), left.max(), gpu_gib) * 1.8)
    ax.set_ylim(-0.6, n - 0.1)
    ax.set_xlabel(tr("GiB (estimate, not measured)"))
    ax.grid(axis="x", alpha=0.3)
    fig.legend(loc="outside lower center", ncol=5, fontsize=8, frameon=False)
    set_title(fig, title, size)
    return fig
