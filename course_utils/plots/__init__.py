"""Charts of the course: measured vs estimated time and memory (matplotlib).

Every function returns a ``matplotlib.figure.Figure`` and draws only what it is given.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .config import MiB

__all__ = ["comparison_chart", "MiB", "dashboard_chart", "budget_chart", "scale_chart",
           "adoption_chart", "styled_claims", "format_range_chart",
           "log2_histogram_chart", "scaler_trace_chart", "memory_breakdown_chart",
           "loss_curves_chart", "saved_tensors_chart", "memory_growth_chart",
           "segments_chart", "pareto_chart", "attention_memory_chart",
           "memory_timeline_chart"]

_COLORS = {"activations": "#4C72B0", "autocast_weight_copies": "#DD8452", "logits": "#55A868",
           "parameters": "#8172B3", "gradients": "#937860", "optimizer_state": "#DA8BC3"}


def _nan(v):
    return np.nan if v is None else float(v)


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




# --- lesson 03: budget search, memory at scale, order of adoption, claims ledger -------------

_SERIES = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860")


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


def scale_chart(table, gpus=None, title: str = ""):
    """Estimated memory per model and recipe (GiB), one panel per model, for
    `course_utils.scaling.scale_table`.

    Stacked horizontal bars: weights, gradients, AdamW state, autocast weight copies, saved
    activations (+ logits); the estimated peak of a step (which also counts temporaries such as
    AdamW's) as a black tick; ``gpus`` (``{name: GiB}``) as dashed vertical lines where they fall
    within 1.3x of a panel's largest value.

    Raises:
        ValueError: an empty table.
    """
    if len(table) == 0:
        raise ValueError("scale_chart() needs a non-empty scale_table().")
    gpus = gpus or {}
    models = list(dict.fromkeys(table["model"]))
    per = max(len(table[table["model"] == m]) for m in models)
    fig, axes = plt.subplots(len(models), 1, figsize=(11, 0.9 + len(models) * (0.55 * per + 0.9)),
                             squeeze=False)
    parts = (("weights", "parameters"), ("gradients", "gradients"),
             ("AdamW state", "optimizer_state"), ("weight copies", "autocast_weight_copies"),
             ("activations", "activations"))
    for ax, model in zip(axes[:, 0], models):
        sub = table[table["model"] == model]
        y = np.arange(len(sub))[::-1]
        left = np.zeros(len(sub))
        for col, key in parts:
            vals = sub[col].to_numpy(dtype=float)
            ax.barh(y, vals, left=left, color=_COLORS[key], label=col, height=0.65)
            left = left + vals
        peak = sub["peak"].to_numpy(dtype=float)
        ax.scatter(peak, y, marker="|", s=400, color="black", linewidths=2, zorder=3,
                   label="estimated peak of a step")
        for yi, pk in zip(y, peak):
            ax.annotate(f"{pk:,.0f} GiB", (pk, yi), xytext=(6, -3), textcoords="offset points",
                        fontsize=8)
        ax.set_yticks(y)
        ax.set_yticklabels(sub["recipe"], fontsize=9)
        top = max(peak.max(), left.max())
        shown = {n: g for n, g in gpus.items() if g <= 1.3 * top}
        xmax = max([top] + list(shown.values())) * 1.15
        for j, (name, gib) in enumerate(shown.items()):
            ax.axvline(gib, color="#B71C1C", ls="--", lw=1)
            ax.text(gib, 0.97 - 0.13 * j, f" {name}", transform=ax.get_xaxis_transform(),
                    fontsize=8, color="#B71C1C", ha="left", va="top",
                    bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=1))
        ax.set_xlim(0, xmax)
        ax.set_ylim(-0.6, len(sub) - 0.1)
        ax.set_title(f"{model} ({sub['params (B)'].iloc[0]:.2f}B parameters)", fontsize=10,
                     loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("GiB (estimate, not measured)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, ncol=6, loc="lower center", bbox_to_anchor=(0.5, 0.0))
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
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


_STATUS_STYLE = {"held": "background-color: #C8E6C9", "failed": "background-color: #FFCDD2",
                 "depends": "background-color: #FFE0B2", "untested": "background-color: #E0E0E0"}


def styled_claims(table):
    """`course_utils.claims.claims_table` as an HTML table: status coloured (held green, failed
    red, depends orange, untested grey), markdown links ``[text](href)`` in ``where`` made
    clickable, text left-aligned.

    Returns:
        A ``pandas.io.formats.style.Styler`` (display it as a cell's last expression).
    """
    import html
    import re

    def links(text):
        text = html.escape(str(text))
        return re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r'<a href="\2">\1</a>', text)

    view = table.copy()
    view["where"] = [links(w) for w in view["where"]]
    view["says"] = [html.escape(str(s)) for s in view["says"]]
    view["evidence"] = [html.escape(str(s)) for s in view["evidence"]]
    return (view.style
            .map(lambda s: _STATUS_STYLE.get(s, ""), subset=["status"])
            .set_properties(**{"text-align": "left", "vertical-align": "top"})
            .set_table_styles([{"selector": "th", "props": [("text-align", "left")]}]))


# --- lesson 01 (AMP review): number formats, gradient histograms, GradScaler trace, memory ----


_FORMAT_COLORS = {"fp32": "#4C72B0", "fp16": "#DD8452", "bf16": "#55A868", "fp8 e4m3": "#C44E52",
                  "fp8 e5m2": "#8172B3"}


def format_range_chart(table, title: str = "what each format can represent"):
    """Representable magnitudes of each format on a log axis (one horizontal bar per format).

    Args:
        table: `course_utils.precision.format_table()` (columns ``smallest subnormal``,
            ``smallest normal``, ``max``, ``eps``; indexed by format name).

    The solid part of a bar is the normal range [smallest normal, max]; the light part the
    subnormal range [smallest subnormal, smallest normal) where precision thins out. Each bar is
    labelled with its eps (the relative spacing of values near 1).

    Returns:
        A ``matplotlib.figure.Figure`` made without pyplot.

    Raises:
        ValueError: ``table`` lacks one of the columns above or has no rows.
    """
    from matplotlib.figure import Figure

    need = {"smallest subnormal", "smallest normal", "max", "eps"}
    if len(table) == 0 or not need <= set(table.columns):
        raise ValueError(f"format_range_chart needs a format_table() with columns {sorted(need)}.")
    names = list(table.index)[::-1]
    fig = Figure(figsize=(9, 0.55 * len(names) + 1.6))
    ax = fig.subplots()
    for y, name in enumerate(names):
        r = table.loc[name]
        lo, mid, hi = (np.log10(float(r[c])) for c in ("smallest subnormal", "smallest normal",
                                                       "max"))
        c = _FORMAT_COLORS.get(name, "#937860")
        ax.barh(y, mid - lo, left=lo, color=c, alpha=0.35, height=0.6)
        ax.barh(y, hi - mid, left=mid, color=c, height=0.6)
        ax.annotate(f"eps = {float(r['eps']):.3g}", (hi, y), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=8)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names)
    ax.set_xlabel("log10 |value|   (light: subnormal range, solid: normal range)")
    ax.axvline(0, color="grey", lw=0.8, ls=":")
    ax.grid(axis="x", alpha=0.3)
    xmin, xmax = ax.get_xlim()
    ax.set_xlim(xmin, xmax + 0.12 * (xmax - xmin))
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def log2_histogram_chart(hists: dict, fmt="fp16", scale: float | None = None, title: str = ""):
    """Histograms of ``floor(log2|g|)`` against a format's limits.

    Args:
        hists: ``{name: pd.Series}`` from `course_utils.precision.log2_histogram` (index: the
            exponent bin ``k`` of ``[2^k, 2^(k+1))``, values: counts).
        fmt: the format whose limits are shaded: below half its smallest subnormal values round
            to 0 (red), below its smallest normal they are subnormal (yellow), above its max they
            overflow (purple).
        scale: if given, each histogram is drawn again shifted by ``log2(scale)`` (dashed):
            where the same values sit after loss scaling.

    The y axis is logarithmic (fraction of the nonzero values per bin), so that the few values
    that round to 0 stay visible next to the many that do not.

    Returns:
        A ``matplotlib.figure.Figure`` (one panel per histogram) made without pyplot.

    Raises:
        ValueError: no histograms, or a scale that is not a positive number.
    """
    from matplotlib.figure import Figure

    from .precision import format_info

    if not hists:
        raise ValueError("log2_histogram_chart needs at least one histogram.")
    if scale is not None and not scale > 0:
        raise ValueError(f"scale must be positive, got {scale!r}.")
    info = format_info(fmt)
    sub, normal, mx = (np.log2(info.smallest_subnormal), np.log2(info.smallest_normal),
                       np.log2(info.max))
    shift = np.log2(scale) if scale else 0.0
    fig = Figure(figsize=(10, 2.6 * len(hists) + 0.6))
    axes = np.atleast_1d(fig.subplots(len(hists), 1, sharex=True))
    lo = min(int(h.index.min()) for h in hists.values())
    hi = max(int(h.index.max()) + shift for h in hists.values())
    lo, hi = min(lo, sub - 3), max(hi, mx + 2)
    for ax, (name, h) in zip(axes, hists.items()):
        k = np.asarray(h.index, dtype=float)
        total = max(1.0, float(np.sum(h.values)))
        frac = np.asarray(h.values, dtype=float) / total
        ax.axvspan(lo - 1, sub - 1, color="#C44E52", alpha=0.22, lw=0,
                   label=f"rounds to 0 in {info.name}")
        ax.axvspan(sub - 1, normal, color="#F2B134", alpha=0.2, lw=0,
                   label=f"{info.name} subnormal (fewer bits)")
        ax.axvspan(mx, hi + 2, color="#8172B3", alpha=0.15, lw=0,
                   label=f"overflows to inf in {info.name}")
        ax.bar(k + 0.5, np.where(frac > 0, frac, np.nan), width=1.0, color="#4C72B0",
               label=f"{name}")
        if scale:
            ax.step(np.append(k, k[-1] + 1) + shift, np.append(frac, frac[-1]), where="post",
                    color="black", ls="--", lw=1.2, label=f"the same x {scale:g} (2^{shift:g})")
        ax.set_yscale("log")
        ax.set_ylim(0.5 / total, 1.0)
        ax.set_ylabel("fraction (log scale)")
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(axis="y", alpha=0.3)
    axes[-1].set_xlim(lo - 1, hi + 2)
    axes[-1].set_xlabel("log2 |gradient|")
    fig.suptitle(title or f"gradients against {info.name}'s range", fontsize=10)
    fig.tight_layout()
    return fig


def scaler_trace_chart(steps, scales, skipped=(), injected=(), title: str = ""):
    """GradScaler's scale after each step (log2 axis), skipped steps and injected inf/NaN marked.

    Args:
        steps: step numbers; ``scales``: the scale after ``scaler.update()`` at each step.
        skipped: steps whose optimizer step was skipped; ``injected``: steps where an inf/NaN
            was put into a gradient.

    Returns:
        A ``matplotlib.figure.Figure`` made without pyplot.

    Raises:
        ValueError: ``steps`` and ``scales`` differ in length or are empty.
    """
    from matplotlib.figure import Figure

    steps, scales = list(steps), [float(s) for s in scales]
    skipped, injected = list(skipped), list(injected)
    if not steps or len(steps) != len(scales):
        raise ValueError("scaler_trace_chart needs as many scales as steps (at least one).")
    fig = Figure(figsize=(9, 3.2))
    ax = fig.subplots()
    ax.step(steps, scales, where="post", color="#4C72B0", label="scale after update()")
    at = dict(zip(steps, scales))
    for i, s in enumerate(injected):
        ax.axvline(s, color="#C44E52", alpha=0.35, lw=3,
                   label="inf/NaN injected" if i == 0 else None)
    if skipped:
        ax.scatter(list(skipped), [at[s] for s in skipped], marker="x", s=80, color="black",
                   zorder=4, label="optimizer step skipped")
    ax.set_yscale("log", base=2)
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("loss scale")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(title or "dynamic loss scaling", fontsize=10)
    fig.tight_layout()
    return fig


def memory_breakdown_chart(df, title: str = ""):
    """Where a training step's bytes are, per configuration: measured and estimated, stacked.

    Args:
        df: a `course_utils.experiments.compare` table (memory fields and their ``est_`` twins,
            bytes).

    For each configuration two bars: measured (solid) and the analytic estimate (hatched), each
    stacked as parameters, gradients, AdamW state, saved activations, autocast weight copies,
    logits + loss (MiB = 2^20 bytes). The measured peak is a black tick, annotated with its
    ratio to the first row. The stack is not the peak: gradients and saved activations are not
    all alive at the same moment.

    Returns:
        A ``matplotlib.figure.Figure`` made without pyplot.

    Raises:
        ValueError: ``df`` has no rows.
    """
    from matplotlib.figure import Figure

    if len(df) == 0:
        raise ValueError("memory_breakdown_chart needs at least one row.")
    parts = (("parameters", "parameters"), ("gradients", "gradients"),
             ("optimizer_state", "AdamW state"), ("activations", "saved activations"),
             ("autocast_weight_copies", "autocast weight copies"), ("logits", "logits + loss"))
    n = len(df)
    x = np.arange(n)
    w = 0.38
    fig = Figure(figsize=(max(7.5, 2.4 * n + 4), 4.4))
    ax = fig.subplots()
    for offset, prefix, hatch in ((-w / 2, "", None), (w / 2, "est_", "//")):
        bottom = np.zeros(n)
        for key, name in parts:
            vals = np.nan_to_num(np.array([_nan(v) / MiB for v in df[prefix + key]]))
            ax.bar(x + offset, vals, w, bottom=bottom, color=_COLORS[key], hatch=hatch,
                   edgecolor="white" if hatch else None, label=name if not prefix else None)
            bottom = bottom + vals
        tops = bottom
        for xi, top in zip(x, tops):
            ax.annotate(f"sum {top:.0f}", (xi + offset, top), xytext=(0, 2),
                        textcoords="offset points", ha="center", fontsize=7)
    peak = np.array([_nan(v) / MiB for v in df["peak_allocated"]])
    ax.scatter(x - w / 2, peak, marker="_", s=700, color="black", linewidths=2.5, zorder=3,
               label="measured peak")
    first = peak[0] if n and not np.isnan(peak[0]) else np.nan
    for xi, pk in zip(x, peak):
        if not np.isnan(pk) and not np.isnan(first):
            ax.annotate(f"peak {pk:.0f} MiB\n({pk / first:.2f}x)", (xi - w / 2, pk),
                        xytext=(0, -8), textcoords="offset points", ha="center", va="top",
                        fontsize=8, fontweight="bold",
                        bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.85))
    ax.set_xticks(x)
    ax.set_xticklabels([f"{lab}\nmeasured | estimate" for lab in df["label"]], fontsize=9)
    ax.set_ylabel("MiB")
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.18)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title or "where the bytes of a training step are", fontsize=10)
    fig.tight_layout()
    return fig


def loss_curves_chart(curves: dict, title: str = "", ylabel: str = "validation loss (nats/byte)"):
    """Validation loss against optimizer step, one line per run, plus a zoom on the second half.

    Args:
        curves: ``{label: history}`` where a history is a `course_utils.training.TrainHistory`
            (its ``val_steps`` and ``val_loss`` are drawn) or a ``(steps, losses)`` pair.

    Returns:
        A ``matplotlib.figure.Figure`` made without pyplot: the whole run on the left, the
        second half (where the runs differ) on the right; the legend gives each final loss.

    Raises:
        ValueError: no curves, or a curve whose steps and losses differ in length.
    """
    from matplotlib.figure import Figure

    if not curves:
        raise ValueError("loss_curves_chart needs at least one curve.")
    data = {}
    for label, h in curves.items():
        steps, losses = ((h.val_steps, h.val_loss) if hasattr(h, "val_loss") else h)
        steps, losses = list(steps), [float(v) for v in losses]
        if len(steps) != len(losses) or not steps:
            raise ValueError(f"curve {label!r}: {len(steps)} steps but {len(losses)} losses.")
        data[label] = (steps, losses)
    fig = Figure(figsize=(11, 4))
    axes = fig.subplots(1, 2)
    styles = ["-", "--", "-.", ":"]
    last = max(s[-1] for s, _ in data.values())
    for ax, zoom in zip(axes, (False, True)):
        for i, (label, (steps, losses)) in enumerate(data.items()):
            keep = [j for j, s in enumerate(steps) if not zoom or s >= last / 2]
            ax.plot([steps[j] for j in keep], [losses[j] for j in keep], styles[i % len(styles)],
                    marker="o", ms=3, lw=1.6, label=f"{label}: {losses[-1]:.3f}")
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(ylabel)
    axes[0].set_title("whole run", fontsize=10)
    axes[1].set_title("zoom: second half", fontsize=10)
    axes[1].legend(fontsize=8, title="run: final loss", title_fontsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


# --- lesson 02 (activation checkpointing): saved tensors, segments, Pareto, attention, timeline --


def _mib(values):
    return np.array([_nan(v) / MiB for v in values], dtype=float)


def saved_tensors_chart(tables: dict, title: str = "saved tensors of one block"):
    """Stacked bars of the bytes saved for backward, one bar per table, one segment per module.

    Args:
        tables: ``{bar label: DataFrame}``, each frame as returned by
            `course_utils.timeline.saved_by_module` (columns ``module``, ``module_type``,
            ``shape``, ``nbytes``).
        title: the axes title.

    Segments are grouped by module in order of first appearance and labelled with the module
    name and the shapes it saved; each bar is annotated with its total in MiB (2^20 bytes).

    Raises:
        ValueError: no tables, or a table without the columns above.
    """
    if not tables:
        raise ValueError("saved_tensors_chart needs at least one table.")
    groups, order = {}, []
    for bar, df in tables.items():
        missing = {"module", "module_type", "shape", "nbytes"} - set(df.columns)
        if missing:
            raise ValueError(f"table {bar!r} lacks columns {sorted(missing)}.")
        for mod, kind, shape, nbytes in zip(df["module"], df["module_type"], df["shape"],
                                            df["nbytes"]):
            key = mod or f"({kind} input)"
            if key not in groups:
                groups[key] = {"shapes": [], "bytes": {}}
                order.append(key)
            g = groups[key]
            if tuple(shape) not in g["shapes"] and len(g["shapes"]) < 3:
                g["shapes"].append(tuple(shape))
            g["bytes"][bar] = g["bytes"].get(bar, 0) + int(nbytes)
    cmap = plt.get_cmap("tab20")
    bars = list(tables)
    fig, ax = plt.subplots(figsize=(4.5 + 1.6 * len(bars), 4.6))
    bottom = np.zeros(len(bars))
    for i, key in enumerate(order):
        vals = np.array([groups[key]["bytes"].get(b, 0) / MiB for b in bars])
        shapes = ", ".join("x".join(map(str, s)) for s in groups[key]["shapes"])
        ax.bar(range(len(bars)), vals, bottom=bottom, width=0.55, color=cmap(i % 20),
               edgecolor="white", linewidth=0.6, label=f"{key}: {shapes}")
        bottom += vals
    for i, total in enumerate(bottom):
        ax.annotate(f"{total:.2f} MiB", (i, total), xytext=(0, 3), textcoords="offset points",
                    ha="center", fontsize=9)
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels(bars)
    ax.set_ylabel("saved for backward (MiB)")
    ax.set_ylim(0, max(bottom.max() * 1.12, 1e-9))
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], names[::-1], title="saved while running (shapes), top to bottom",
              fontsize=8, title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              frameon=False)
    fig.tight_layout()
    return fig


def memory_growth_chart(df, title: str = ""):
    """Activation vs parameter-related memory as batch size and sequence length grow.

    Args:
        df: one row per configuration with columns ``sweep`` (``"batch_size"`` or
            ``"seq_len"``: the dimension varied), ``batch_size``, ``seq_len``,
            ``saved`` and ``est_saved`` (bytes saved for backward: measured, estimated),
            ``static`` and ``est_static`` (parameters + gradients + optimizer state: measured
            where known, else NaN; estimated).

    Draws one panel per sweep (linear axes, so linear growth is a straight line): estimates as
    lines, measurements as points.

    Raises:
        ValueError: missing columns or no rows.
    """
    need = {"sweep", "batch_size", "seq_len", "saved", "est_saved", "static", "est_static"}
    if len(df) == 0 or need - set(df.columns):
        raise ValueError(f"memory_growth_chart needs rows with columns {sorted(need)}.")
    sweeps = list(dict.fromkeys(df["sweep"]))
    fig, axes = plt.subplots(1, len(sweeps), figsize=(5.2 * len(sweeps), 4.0), sharey=True,
                             squeeze=False)
    names = {"batch_size": "batch size (sequences)", "seq_len": "sequence length (tokens)"}
    for ax, sweep in zip(axes[0], sweeps):
        d = df[df["sweep"] == sweep].sort_values(sweep)
        x = d[sweep].to_numpy()
        ax.plot(x, _mib(d["est_saved"]), color=_COLORS["activations"],
                label="saved tensors (estimate)")
        ax.plot(x, _mib(d["saved"]), "o", color=_COLORS["activations"],
                label="saved tensors (measured)")
        ax.plot(x, _mib(d["est_static"]), color=_COLORS["optimizer_state"],
                label="params + grads + AdamW state (estimate)")
        ax.plot(x, _mib(d["static"]), "s", color=_COLORS["optimizer_state"],
                label="params + grads + AdamW state (measured)")
        ax.set_xticks(x)
        ax.set_xticklabels([str(int(v)) for v in x])
        ax.set_xlim(0, x.max() * 1.05)
        ax.set_ylim(bottom=0)
        ax.set_xlabel(names.get(sweep, sweep))
        ax.grid(alpha=0.3)
        ax.set_title(f"growing the {names.get(sweep, sweep).split(' (')[0]}")
    axes[0][0].set_ylabel("MiB")
    axes[0][0].legend(fontsize=8, loc="upper left")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def segments_chart(df, n_layers: int, title: str = ""):
    """Saved bytes and peak memory against the number of checkpointed segments.

    Args:
        df: one row per (method, segments) with columns ``method`` (a label such as
            ``"every segment checkpointed"``), ``segments``, ``saved_bytes``, ``peak_bytes``
            (measured, bytes) and optionally ``est_saved`` / ``est_peak`` (a model, bytes,
            drawn dashed for each method that has them).
        n_layers: the stack's depth ``N``; a dotted line marks ``sqrt(N)`` segments.

    Raises:
        ValueError: missing columns or no rows.
    """
    need = {"method", "segments", "saved_bytes", "peak_bytes"}
    if len(df) == 0 or need - set(df.columns):
        raise ValueError(f"segments_chart needs rows with columns {sorted(need)}.")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.0))
    colors = ["#4C72B0", "#C44E52", "#55A868", "#8172B3"]
    for ax, col, est, name in ((axes[0], "saved_bytes", "est_saved", "saved for backward"),
                               (axes[1], "peak_bytes", "est_peak",
                                "peak during forward + backward")):
        for i, (method, d) in enumerate(df.groupby("method", sort=False)):
            d = d.sort_values("segments")
            c = colors[i % len(colors)]
            ax.plot(d["segments"], _mib(d[col]), "o-", color=c, label=f"{method} (measured)")
            if est in d.columns and d[est].notna().any():
                ax.plot(d["segments"], _mib(d[est]), "--", color=c, alpha=0.7,
                        label=f"{method} (model)")
        ax.axvline(np.sqrt(n_layers), color="grey", linestyle=":", linewidth=1.2)
        ax.annotate(f"sqrt(N) = {np.sqrt(n_layers):.1f}", (np.sqrt(n_layers), 1.0),
                    xycoords=("data", "axes fraction"), xytext=(3, -12),
                    textcoords="offset points", fontsize=8, color="grey")
        ax.set_xscale("log", base=2)
        segs = sorted(set(int(s) for s in df["segments"]))
        ax.set_xticks(segs)
        ax.set_xticklabels([str(s) for s in segs])
        ax.set_xlabel(f"segments (N = {n_layers} blocks)")
        ax.set_ylabel("MiB")
        ax.set_ylim(bottom=0)
        ax.set_title(name)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
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


def attention_memory_chart(df, title: str = "saved bytes of one block vs sequence length"):
    """Log-log saved bytes against sequence length, one line per attention implementation.

    Args:
        df: columns ``attention``, ``seq_len``, ``saved_bytes`` (measured) and optionally
            ``est_bytes`` (estimate, drawn dashed). The legend gives each measured line's slope
            between its last two points (1: linear in the sequence, 2: quadratic).

    Raises:
        ValueError: missing columns or no rows.
    """
    need = {"attention", "seq_len", "saved_bytes"}
    if len(df) == 0 or need - set(df.columns):
        raise ValueError(f"attention_memory_chart needs rows with columns {sorted(need)}.")
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    colors = {"naive": "#C44E52", "sdpa": "#4C72B0"}
    others = iter(["#8172B3", "#55A868", "#937860", "#DA8BC3"])
    for name, d in df.groupby("attention", sort=False):
        d = d.sort_values("seq_len")
        x, y = d["seq_len"].to_numpy(float), d["saved_bytes"].to_numpy(float)
        slope = (np.log(y[-1] / y[-2]) / np.log(x[-1] / x[-2])) if len(x) > 1 else np.nan
        c = colors.get(name) or next(others, None)
        ax.plot(x, y / MiB, "o-", color=c, label=f"{name}: measured (slope {slope:.2f})")
        if "est_bytes" in d.columns and d["est_bytes"].notna().any():
            ax.plot(x, _mib(d["est_bytes"]), "--", color=c, alpha=0.6, label=f"{name}: estimate")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    from matplotlib.ticker import FuncFormatter
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    xs = sorted(set(int(v) for v in df["seq_len"]))
    ax.set_xticks(xs)
    ax.set_xticklabels([str(v) for v in xs])
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("saved for backward (MiB, log scale)")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def memory_timeline_chart(timelines: dict, title: str = "memory over one training step"):
    """Bytes allocated over time, one panel per run, with the marked phases shaded.

    Args:
        timelines: ``{label: Timeline}`` (`course_utils.timeline.memory_timeline`).

    The panels share both axes so that heights and durations compare directly; each panel marks
    its peak.

    Raises:
        ValueError: no timelines.
    """
    if not timelines:
        raise ValueError("memory_timeline_chart needs at least one timeline.")
    n = len(timelines)
    fig, axes = plt.subplots(n, 1, figsize=(9, 2.4 * n + 0.6), sharex=True, sharey=True,
                             squeeze=False)
    shades = {"forward": "#4C72B0", "backward": "#C44E52", "optimizer": "#55A868"}
    extra = ["#8172B3", "#937860", "#DA8BC3"]
    for ax, (label, tl) in zip(axes[:, 0], timelines.items()):
        t = np.asarray(tl.t_ms, dtype=float)
        a = np.asarray(tl.allocated, dtype=float) / MiB
        ax.step(t, a, where="post", color="black", linewidth=1.0)
        for k, p in enumerate(tl.phases):
            c = shades.get(p.name, extra[k % len(extra)])
            ax.axvspan(p.start_ms, p.end_ms, color=c, alpha=0.12, linewidth=0)
            ax.annotate(p.name, ((p.start_ms + p.end_ms) / 2, 1.0),
                        xycoords=("data", "axes fraction"), xytext=(0, -11),
                        textcoords="offset points", ha="center", fontsize=8, color=c)
        if len(a):
            i = int(np.argmax(a))
            ax.plot(t[i], a[i], "o", color="#C44E52", markersize=5)
            ax.annotate(f"peak {a[i]:.1f} MiB", (t[i], a[i]), xytext=(6, -4),
                        textcoords="offset points", fontsize=8, color="#C44E52")
        ax.set_ylabel("MiB above start")
        ax.set_title(label, fontsize=10, loc="left")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("time (ms)")
    top = max((max(tl.allocated) if tl.allocated else 0) for tl in timelines.values()) / MiB
    low = min((min(tl.allocated) if tl.allocated else 0) for tl in timelines.values()) / MiB
    axes[0, 0].set_ylim(min(0, low) * 1.1, top * 1.22 + 1e-9)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


