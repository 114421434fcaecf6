"""Where the bytes of a training step are: breakdowns, saved tensors, growth with batch and
sequence, the allocation timeline, and estimates at model scale.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..config import MiB
from ._style import _COLORS, _mib, _nan


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
