"""Charts of a `course_utils.experiments.compare` table and its relatives: the ladder of
configurations, the live dashboard, the order of adoption, the Pareto front, the budget search.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..config import MiB
from ._style import _COLORS, _SERIES, _mib, _nan


def comparison_chart(df, title: str = ""):
    """Three panels for a `course_utils.experiments.compare` table.

    1. step time (ms, median with IQR bars); 2. peak allocated memory (MiB), measured bars with
    the estimate as a black tick; 3. saved tensors (MiB) stacked by kind (activations, autocast
    weight copies, logits), with the estimated total as a tick.
    """
    labels = list(df["label"])
    x = np.arange(len(labels))
    fig, axes = plt.subplots(1, 3, figsize=(max(10, 2.2 * len(labels) + 6), 4.2))
    ax = axes[0]
    t = np.array([_nan(v) * 1e3 for v in df["step_time_s"]])
    iqr = np.array([_nan(v) * 1e3 / 2 for v in df["step_time_iqr_s"]])
    ax.bar(x, t, yerr=iqr, color="#4C72B0", capsize=3)
    ax.set_ylabel("step time (ms)")
    ax.set_title("step time (median, IQR)")
    for xi, ti, ei, ratio in zip(x, t, iqr, df["time_ratio"]):
        if ratio is not None and not np.isnan(_nan(ratio)) and not np.isnan(ti):
            ax.annotate(f"{ratio:.2f}x", (xi, ti + np.nan_to_num(ei)), xytext=(0, 3),
                        textcoords="offset points", ha="center", color="black", fontsize=8)
    ax.margins(y=0.12)

    ax = axes[1]
    peak = np.array([_nan(v) / MiB for v in df["peak_allocated"]])
    est = np.array([_nan(v) / MiB for v in df["est_peak_allocated"]])
    ax.bar(x, peak, color="#8172B3", label="measured")
    ax.scatter(x, est, marker="_", s=600, color="black", linewidths=2, label="estimate", zorder=3)
    ax.set_ylabel("MiB")
    ax.set_title("peak allocated memory")
    ax.legend(loc="lower right", fontsize=8)

    ax = axes[2]
    bottom = np.zeros(len(labels))
    for kind, name in (("activations", "activations"), ("autocast_weight_copies",
                                                         "autocast weight copies"),
                       ("logits", "logits + loss")):
        vals = np.array([_nan(v) / MiB for v in df[kind]])
        ax.bar(x, vals, bottom=bottom, color=_COLORS[kind], label=name)
        bottom = bottom + np.nan_to_num(vals)
    est = np.array([_nan(v) / MiB for v in df["est_saved_total"]])
    ax.scatter(x, est, marker="_", s=600, color="black", linewidths=2, label="estimate", zorder=3)
    ax.set_ylabel("MiB")
    ax.set_title("saved tensors (for backward)")
    ax.legend(fontsize=8)
    for ax in axes:
        ax.set_xticks(x)
        ax.set_xticklabels(labels, rotation=30, ha="right")
        ax.grid(axis="y", alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def dashboard_chart(df, last: int = 10, title: str = ""):
    """The live dashboard's chart (`course_utils.widgets`): its last ``last`` runs.

    ``df`` is `Dashboard.history`: one row per run with ``run``, ``label``, ``baseline``,
    ``status`` (``ok``/``OOM``/``error``), ``batch_size``, ``seq_len``, ``n_layers``,
    ``step_time_s`` (seconds), ``time_ratio`` and ``peak_ratio`` (to the fp32 baseline of the
    same size) and the memory fields in bytes.

    1. step time (ms) per run, fp32 baselines in grey, each bar annotated with its ratio to the
       baseline; 2. memory breakdown (MiB) stacked: parameters, gradients, AdamW state, saved
       activations, autocast weight copies, logits; the measured peak as a black tick, annotated
       with its ratio to the baseline's peak. Runs that ran out of memory or failed are marked.

    Returns:
        A ``matplotlib.figure.Figure`` made without pyplot (nothing is shown implicitly).

    Raises:
        ValueError: ``df`` has no rows.
    """
    from matplotlib.figure import Figure

    if len(df) == 0:
        raise ValueError("dashboard_chart() needs at least one run in the history.")
    df = df.tail(last)
    n = len(df)
    x = np.arange(n)
    labels = [f"#{r.run} {r.label}{' (base)' if r.baseline else ''}\n"
              f"b{r.batch_size} s{r.seq_len} L{r.n_layers}" for r in df.itertuples()]
    fig = Figure(figsize=(max(9.0, 1.3 * n + 4.5), 4.2))
    ax_t, ax_m = fig.subplots(1, 2)

    t = np.array([_nan(v) * 1e3 for v in df["step_time_s"]])
    colors = ["#9E9E9E" if b else "#4C72B0" for b in df["baseline"]]
    ax_t.bar(x, np.nan_to_num(t), color=colors)
    for xi, ti, ratio, status in zip(x, t, df["time_ratio"], df["status"]):
        if status != "ok":
            ax_t.annotate(status, (xi, 0), xytext=(0, 3), textcoords="offset points",
                          ha="center", color="#B71C1C", fontsize=9, fontweight="bold")
        elif not np.isnan(_nan(ratio)):
            ax_t.annotate(f"{ratio:.2f}x", (xi, ti), xytext=(0, 2), textcoords="offset points",
                          ha="center", fontsize=8)
    ax_t.set_ylabel("step time (ms)")
    ax_t.set_title("step time (ratio to fp32 baseline)", fontsize=10)

    bottom = np.zeros(n)
    for kind, name in (("parameters", "parameters"), ("gradients", "gradients"),
                       ("optimizer_state", "AdamW state"), ("activations", "activations"),
                       ("autocast_weight_copies", "autocast weight copies"),
                       ("logits", "logits + loss")):
        vals = np.nan_to_num(np.array([_nan(v) / MiB for v in df[kind]]))
        ax_m.bar(x, vals, bottom=bottom, color=_COLORS.get(kind, "#CCB974"), label=name)
        bottom = bottom + vals
    peak = np.array([_nan(v) / MiB for v in df["peak_allocated"]])
    ax_m.scatter(x, peak, marker="_", s=500, color="black", linewidths=2,
                 label="peak allocated", zorder=3)
    for xi, pk, ratio, status in zip(x, peak, df["peak_ratio"], df["status"]):
        if status != "ok":
            ax_m.annotate(status, (xi, 0), xytext=(0, 3), textcoords="offset points",
                          ha="center", color="#B71C1C", fontsize=9, fontweight="bold")
        elif not np.isnan(_nan(ratio)) and not np.isnan(pk):
            ax_m.annotate(f"{ratio:.2f}x", (xi, pk), xytext=(0, 4), textcoords="offset points",
                          ha="center", fontsize=8)
    ax_m.set_ylabel("MiB")
    ax_m.set_title("memory breakdown (peak ratio to fp32 baseline)", fontsize=10)
    ax_m.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    for ax in (ax_t, ax_m):
        ax.set_xticks(x)
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.margins(y=0.15)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def adoption_chart(story, title: str = ""):
    """The order of adoption: step time (ms) and peak memory (MiB) after each step.

    ``story`` has one row per step with ``step`` (name), ``step_time_s`` (seconds or NaN),
    ``peak_allocated`` (bytes or NaN) and ``source`` (``measured``, ``estimate`` or another word
    for "not measured here"). Measured bars are solid, estimates hatched, missing values
    marked "not measured here"; each value is annotated with its ratio to the previous step
    that has one.

    Raises:
        ValueError: an empty ``story``.
    """
    if len(story) == 0:
        raise ValueError("adoption_chart() needs at least one step.")
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    x = np.arange(len(story))
    for ax, col, scale, ylabel, color in (
            (axes[0], "step_time_s", 1e3, "step time (ms)", "#4C72B0"),
            (axes[1], "peak_allocated", 1 / MiB, "peak allocated (MiB)", "#8172B3")):
        vals = np.array([_nan(v) for v in story[col]], dtype=float) * scale
        prev = np.nan
        top = np.nanmax(vals) if np.isfinite(vals).any() else 1.0
        for xi, v, src in zip(x, vals, story["source"]):
            if np.isnan(v):
                ax.annotate("not measured\nhere", (xi, top * 0.02), ha="center", fontsize=8,
                            color="#757575")
                continue
            est = src != "measured"
            ax.bar(xi, v, color="white" if est else color, edgecolor=color,
                   hatch="//" if est else None, lw=1.2)
            note = f"{v / prev:.2f}x" if np.isfinite(prev) else ""
            note += "\n(estimate)" if est else ""
            if note:
                ax.annotate(note, (xi, v), xytext=(0, 3), textcoords="offset points",
                            ha="center", fontsize=8)
            prev = v
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, top * 1.25)
        ax.set_xticks(x)
        ax.set_xticklabels(story["step"], rotation=20, ha="right", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_title("step time; ratio to the previous step", fontsize=10)
    axes[1].set_title("peak memory; ratio to the previous step", fontsize=10)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def pareto_chart(df, title: str = "step time vs peak memory"):
    """Each configuration as a point (step time in ms, peak allocated memory in MiB), the
    non-dominated ones joined by a line (the Pareto front: nothing is both faster and smaller).

    Args:
        df: a `course_utils.experiments.compare` table (``label``, ``step_time_s``,
            ``step_time_iqr_s``, ``peak_allocated``).

    Raises:
        ValueError: no row has both a step time and a peak.
    """
    t = np.array([_nan(v) * 1e3 for v in df["step_time_s"]])
    iqr = np.array([_nan(v) * 1e3 / 2 for v in df["step_time_iqr_s"]])
    peak = _mib(df["peak_allocated"])
    ok = ~(np.isnan(t) | np.isnan(peak))
    if not ok.any():
        raise ValueError("pareto_chart needs rows with a step time and a peak.")
    labels = list(df["label"])
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    ax.errorbar(t[ok], peak[ok], xerr=np.nan_to_num(iqr[ok]), fmt="o", color="#4C72B0",
                ecolor="#9bb0d6", capsize=3, markersize=7, zorder=3)
    for i in np.flatnonzero(ok):
        ax.annotate(labels[i], (t[i], peak[i]), xytext=(6, 5), textcoords="offset points",
                    fontsize=9)
    idx = [i for i in np.flatnonzero(ok)
           if not any((t[j] <= t[i] and peak[j] <= peak[i]) and (t[j] < t[i] or peak[j] < peak[i])
                      for j in np.flatnonzero(ok))]
    idx.sort(key=lambda i: t[i])
    ax.plot(t[idx], peak[idx], "-", color="#DD8452", zorder=2, label="Pareto front")
    ax.set_xlabel("step time (ms, median; bars: interquartile range)")
    ax.set_ylabel("peak allocated memory (MiB)")
    ax.set_title(title)
    lo_t, hi_t = np.nanmin(t[ok]), np.nanmax(t[ok])
    ax.set_xlim(lo_t - 0.08 * (hi_t - lo_t + 1), hi_t + 0.25 * (hi_t - lo_t + 1))
    ax.set_ylim(0, np.nanmax(peak[ok]) * 1.15)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig


def budget_chart(searches, title: str = ""):
    """Two panels for a list of `course_utils.scaling.BatchSearch` (one per configuration).

    1. peak allocated memory (MiB) against micro-batch: each measured batch as a dot (filled:
       fits the budget; x: over it), the estimate as a dashed line, the budget as a red line;
    2. tokens/s against micro-batch at the measured batches, the largest fitting batch starred
       and labelled.

    Raises:
        ValueError: no searches.
    """
    if not searches:
        raise ValueError("budget_chart() needs at least one BatchSearch.")
    fig, (ax_m, ax_t) = plt.subplots(1, 2, figsize=(12, 4.4))
    budget = searches[0].budget_bytes / MiB
    for i, s in enumerate(searches):
        c = _SERIES[i % len(_SERIES)]
        if s.estimated:
            eb, ev = zip(*s.estimated)
            ax_m.plot(eb, np.array(ev) / MiB, "--", color=c, alpha=0.6, lw=1)
        probes = sorted(s.probes, key=lambda p: p.batch_size)
        for p in probes:
            if p.peak_allocated is not None:
                ax_m.scatter(p.batch_size, p.peak_allocated / MiB, color=c, zorder=3, s=40,
                             marker="o" if p.fits else "x")
        ax_m.plot([], [], color=c, marker="o", label=f"{s.label}: largest batch {s.batch_size}")
        timed = [p for p in probes if p.tokens_per_s]
        if timed:
            ax_t.plot([p.batch_size for p in timed], [p.tokens_per_s for p in timed], "-o",
                      color=c, ms=4, alpha=0.8, label=s.label)
        if s.tokens_per_s:
            ax_t.scatter(s.batch_size, s.tokens_per_s, marker="*", s=220, color=c, zorder=4,
                         edgecolor="black")
            ax_t.annotate(f"b={s.batch_size}", (s.batch_size, s.tokens_per_s), xytext=(6, -4),
                          textcoords="offset points", fontsize=8)
    ax_m.axhline(budget, color="#B71C1C", lw=1.5, label=f"budget {budget:,.1f} MiB")
    ax_m.set_xlabel("micro-batch (sequences)")
    ax_m.set_ylabel("peak allocated (MiB)")
    ax_m.set_title("measured peak (o fits, x over budget); dashed: estimate", fontsize=10)
    ax_m.legend(fontsize=8)
    ax_t.set_xlabel("micro-batch (sequences)")
    ax_t.set_ylabel("tokens/s")
    ax_t.set_title("tokens/s at the measured batches; * = largest that fits", fontsize=10)
    ax_t.set_ylim(bottom=0)
    ax_t.legend(fontsize=8)
    for ax in (ax_m, ax_t):
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
