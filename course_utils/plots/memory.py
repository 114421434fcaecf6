"""Where the bytes of a training step are: breakdowns, saved tensors, growth with batch and
sequence, the allocation timeline, and estimates at model scale.
"""
from __future__ import annotations

import matplotlib
import numpy as np
from matplotlib.lines import Line2D

from ..i18n import tr
from ..memory_model import ZERO_STAGES, sharded_estimate
from ..terms import MiB
from ._style import (
    ALERT_COLOR,
    BREAKDOWN,
    COLORS,
    HATCH,
    SERIES,
    bucket_name,
    mib,
    new_figure,
    set_title,
    with_size,
)


def memory_breakdown_chart(df, title: str = "", size: str | None = None):
    """Where a training step's bytes are, per configuration: two stacked bars (MiB), measured (solid)
    and estimated (hatched), the measured peak as a black tick with its ratio to the first row's.

    ``df``: a `course_utils.experiments.compare` table: ``label``, ``peak_allocated`` and the
    memory fields ``parameters``, ``gradients``, ``optimizer_state``, ``activations``,
    ``autocast_weight_copies``, ``logits`` with their ``est_`` twins (bytes). Raises ValueError
    for a table without rows."""
    if len(df) == 0:
        raise ValueError(tr("memory_breakdown_chart needs at least one row."))
    n = len(df)
    x = np.arange(n)
    w = 0.38
    fig = new_figure((max(7.5, 2.4 * n + 4), 4.4))
    ax = fig.subplots()
    for offset, prefix, hatch in ((-w / 2, "", None), (w / 2, "est_", HATCH)):
        bottom = np.zeros(n)
        for key in BREAKDOWN:
            vals = np.nan_to_num(mib(df[prefix + key]))
            name = tr("saved activations") if key == "activations" else bucket_name(key)
            ax.bar(x + offset, vals, w, bottom=bottom, color=COLORS[key], hatch=hatch,
                   edgecolor="white" if hatch else None, label=name if not prefix else None)
            bottom = bottom + vals
        for xi, top in zip(x, bottom):
            ax.annotate(tr("sum {total:.0f}", total=top), (xi + offset, top), xytext=(0, 2),
                        textcoords="offset points", ha="center", fontsize=7)
    peak = mib(df["peak_allocated"])
    ax.scatter(x - w / 2, peak, marker="_", s=700, color="black", linewidths=2.5, zorder=3,
               label=tr("measured peak"))
    first = peak[0]
    for xi, pk in zip(x, peak):
        if not np.isnan(pk) and not np.isnan(first):
            ax.annotate(tr("peak {peak:.0f} MiB\n({ratio:.2f}x)", peak=pk, ratio=pk / first),
                        (xi - w / 2, pk),
                        xytext=(0, -8), textcoords="offset points", ha="center", va="top",
                        fontsize=8, fontweight="bold",
                        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85})
    ax.set_xticks(x, [f"{lab}\n" + tr("measured | estimate") for lab in df["label"]], fontsize=9)
    ax.set_ylabel("MiB")
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.18)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(with_size(title or tr("where the bytes of a training step are"), size),
                 fontsize=10)
    return fig


def saved_tensors_chart(tables: dict, title: str = "saved tensors of one block", size: str | None = None):
    """Stacked bars of the bytes saved for backward (MiB), one bar per table, one segment per module
    (in order of first appearance, labelled with the shapes it saved).

    ``tables``: ``{bar label: DataFrame}`` of `course_utils.memory_timeline.saved_by_module`
    (``module``, ``module_type``, ``shape``, ``nbytes``). Raises ValueError for no tables or a
    table without those columns."""
    if not tables:
        raise ValueError(tr("saved_tensors_chart needs at least one table."))
    groups = {}  # in order of first appearance
    for bar, df in tables.items():
        missing = {"module", "module_type", "shape", "nbytes"} - set(df.columns)
        if missing:
            raise ValueError(tr("table {bar!r} lacks columns {columns}.", bar=bar,
                                columns=sorted(missing)))
        for mod, kind, shape, nbytes in zip(df["module"], df["module_type"], df["shape"],
                                            df["nbytes"]):
            g = groups.setdefault(mod or tr("({kind} input)", kind=kind), {"shapes": [], "bytes": {}})
            if tuple(shape) not in g["shapes"] and len(g["shapes"]) < 3:
                g["shapes"].append(tuple(shape))
            g["bytes"][bar] = g["bytes"].get(bar, 0) + int(nbytes)
    cmap = matplotlib.colormaps["tab20"]
    bars = list(tables)
    fig = new_figure((4.5 + 1.6 * len(bars), 4.6))
    ax = fig.subplots()
    bottom = np.zeros(len(bars))
    for i, key in enumerate(groups):
        vals = np.array([groups[key]["bytes"].get(b, 0) / MiB for b in bars])
        shapes = ", ".join("x".join(map(str, s)) for s in groups[key]["shapes"])
        ax.bar(range(len(bars)), vals, bottom=bottom, width=0.55, color=cmap(i % 20),
               edgecolor="white", linewidth=0.6, label=f"{key}: {shapes}")
        bottom += vals
    for i, total in enumerate(bottom):
        ax.annotate(f"{total:.2f} MiB", (i, total), xytext=(0, 3), textcoords="offset points",
                    ha="center", fontsize=9)
    ax.set_xticks(range(len(bars)), bars)
    ax.set_ylabel(tr("saved for backward (MiB)"))
    ax.set_ylim(0, max(bottom.max() * 1.12, 1e-9))
    ax.set_title(with_size(title, size))
    ax.grid(axis="y", alpha=0.3)
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], names[::-1], title=tr("saved while running (shapes), top to bottom"),
              fontsize=8, title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              frameon=False)
    return fig


def memory_growth_chart(df, title: str = "", size: str | None = None):
    """Saved tensors and parameters + gradients + optimizer state (MiB) as the batch size and the
    sequence length grow, one panel per sweep: estimates dashed over the measurements' open
    markers, so a measurement equal to its estimate is a marker threaded by its line.

    ``df``: one row per configuration: ``sweep`` (``"batch_size"`` or ``"seq_len"``, the
    dimension varied), ``batch_size``, ``seq_len``, ``saved``/``est_saved`` and
    ``static``/``est_static`` (bytes, measured NaN where unknown). Raises ValueError for missing
    columns or no rows."""
    need = {"sweep", "batch_size", "seq_len", "saved", "est_saved", "static", "est_static"}
    if len(df) == 0 or need - set(df.columns):
        raise ValueError(tr("memory_growth_chart needs rows with columns {columns}.",
                            columns=sorted(need)))
    sweeps = list(dict.fromkeys(df["sweep"]))
    fig = new_figure((5.2 * len(sweeps), 4.6))
    axes = np.atleast_1d(fig.subplots(1, len(sweeps), sharey=True))
    names = {"batch_size": tr("batch size (sequences)"), "seq_len": tr("sequence length (tokens)")}
    growing = {"batch_size": tr("growing the batch size"),
               "seq_len": tr("growing the sequence length")}
    series = (("saved", tr("saved tensors"), COLORS["activations"], "o"),
              ("static", tr("params + grads + AdamW state"), COLORS["optimizer_state"], "s"))
    for ax, sweep in zip(axes, sweeps):
        d = df[df["sweep"] == sweep].sort_values(sweep)
        x = d[sweep].to_numpy()
        for col, name, color, marker in series:
            ax.plot(x, mib(d[col]), marker, ms=9, mfc="white", mew=1.8, color=color, ls="",
                    zorder=3, label=tr("{series} (measured)", series=name))
            ax.plot(x, mib(d["est_" + col]), "--", lw=1.6, color=color, zorder=4,
                    label=tr("{series} (estimate)", series=name))
        ax.set_xticks(x, [str(int(v)) for v in x])
        ax.set_xlim(0, x.max() * 1.05)
        ax.set_ylim(bottom=0)
        ax.set_xlabel(names.get(sweep, sweep))
        ax.grid(alpha=0.3)
        ax.set_title(growing.get(sweep, tr("growing the {sweep}", sweep=sweep)), fontsize=10)
    axes[0].set_ylabel("MiB")
    handles = [Line2D([], [], color=c, ls="", marker=m, ms=8, mfc="white", mew=1.8,
                      label=tr("{series} (measured)", series=name)) for _, name, c, m in series]
    handles += [Line2D([], [], color=c, ls="--", lw=1.6, label=tr("{series} (estimate)", series=name))
                for _, name, c, _ in series]
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=8, frameon=False,
               title=tr("open markers: measured; dashed lines: estimate (a marker on its line: "
                        "they agree)"), title_fontsize=8)
    set_title(fig, title, size)
    return fig


def _step_share(tl):
    """A function mapping a time (ms) of ``tl`` to its share (%) of the span of its events and
    phases."""
    ends = list(tl.t_ms) + [p.start_ms for p in tl.phases] + [p.end_ms for p in tl.phases]
    t0, t1 = (min(ends), max(ends)) if ends else (0.0, 1.0)
    span = (t1 - t0) or 1.0
    return lambda t: (np.asarray(t, dtype=float) - t0) / span * 100


def memory_timeline_chart(timelines: dict, title: str = "memory over one training step",
                          size: str | None = None):
    """Bytes allocated (MiB above the step's start) over the step, one panel per run (shared axes,
    peak marked), the marked phases shaded. The horizontal axis is the share of the step, not
    milliseconds: on a CPU the profiler slows the step unevenly by more than the step takes.

    ``timelines``: ``{label: Timeline}`` (`course_utils.memory_timeline.memory_timeline`). Raises
    ValueError for no timelines."""
    if not timelines:
        raise ValueError(tr("memory_timeline_chart needs at least one timeline."))
    n = len(timelines)
    fig = new_figure((9, 2.4 * n + 0.6))
    axes = fig.subplots(n, 1, sharex=True, sharey=True, squeeze=False)
    shades = {"forward": "#4C72B0", "backward": "#C44E52", "optimizer": "#55A868"}
    extra = ["#8172B3", "#937860", "#DA8BC3"]
    for ax, (label, tl) in zip(axes[:, 0], timelines.items()):
        share = _step_share(tl)
        t = share(np.asarray(tl.t_ms, dtype=float))
        a = np.asarray(tl.allocated, dtype=float) / MiB
        ax.step(t, a, where="post", color="black", linewidth=1.0)
        for k, p in enumerate(tl.phases):
            c = shades.get(p.name, extra[k % len(extra)])
            start, end = share(p.start_ms), share(p.end_ms)
            ax.axvspan(start, end, color=c, alpha=0.12, linewidth=0)
            ax.annotate(tr(p.name), ((start + end) / 2, 1.0),
                        xycoords=("data", "axes fraction"), xytext=(0, -11),
                        textcoords="offset points", ha="center", fontsize=8, color=c)
        if len(a):
            i = int(np.argmax(a))
            ax.plot(t[i], a[i], "o", color="#C44E52", markersize=5)
            ax.annotate(tr("peak {peak:.1f} MiB", peak=a[i]), (t[i], a[i]), xytext=(6, -4),
                        textcoords="offset points", fontsize=8, color="#C44E52")
        ax.set_ylabel(tr("MiB above start"))
        ax.set_title(label, fontsize=10, loc="left")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel(tr("share of the step (%)"))
    axes[-1, 0].set_xlim(0, 100)
    top = max((max(tl.allocated) if tl.allocated else 0) for tl in timelines.values()) / MiB
    low = min((min(tl.allocated) if tl.allocated else 0) for tl in timelines.values()) / MiB
    axes[0, 0].set_ylim(min(0, low) * 1.1, top * 1.22 + 1e-9)
    set_title(fig, title, size)
    return fig


def scale_chart(sweep, gpus=None, title: str = ""):
    """Estimated peak memory (GiB) of a training step against the micro-batch, one panel per model,
    one line per recipe, of `course_utils.memory_model.scale_sweep`'s table (nothing measured). A
    dotted line marks what the optimizer step holds; filled markers peak there, open ones in
    backward. ``gpus`` (``{name: GiB}``) are dashed lines where they reach 2.5% of the panel's
    largest value (lower, they would sit on the axis). Raises ValueError for an empty table or
    one without `scale_sweep`'s columns."""
    need = {"model", "recipe", "micro-batch", "params (B)", "peak GiB", "peak at",
            "optimizer step GiB"}
    if len(sweep) == 0 or not need <= set(sweep.columns):
        raise ValueError(tr("scale_chart() needs memory_model.scale_sweep()'s table (missing "
                            "{missing}).", missing=sorted(need - set(sweep.columns)) or tr("rows")))
    gpus = gpus or {}
    models = list(dict.fromkeys(sweep["model"]))
    fig = new_figure((4.2 * len(models) + 1, 4.4))
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    for ax, model in zip(axes, models):
        sub = sweep[sweep["model"] == model]
        for color, (recipe, r) in zip(SERIES, sub.groupby("recipe", sort=False)):
            b, peak = r["micro-batch"].to_numpy(), r["peak GiB"].to_numpy(dtype=float)
            at_step = (r["peak at"] == "optimizer step").to_numpy()
            ax.plot(b, peak, color=color, lw=1.5, label=tr(recipe))
            ax.scatter(b[at_step], peak[at_step], color=color, s=22, zorder=3)
            ax.scatter(b[~at_step], peak[~at_step], facecolor="white", edgecolor=color, s=22,
                       zorder=3)
        floor = sub["optimizer step GiB"].iloc[0]
        ax.axhline(floor, color="black", ls=":", lw=1)
        top = max(sub["peak GiB"].max(), floor)
        shown = {name: gib for name, gib in gpus.items() if gib >= 0.025 * top}  # else on the axis
        for name, gib in shown.items():
            ax.axhline(gib, color=ALERT_COLOR, ls="--", lw=1)
            ax.annotate(name, (1, gib), xycoords=("axes fraction", "data"), xytext=(-3, 3),
                        textcoords="offset points", ha="right", fontsize=8, color=ALERT_COLOR)
        ax.set_xscale("log", base=2)
        batches = sorted(set(sub["micro-batch"]))
        ax.set_xticks(batches, [str(v) for v in batches])
        ax.set_ylim(0, max([top, *shown.values()]) * 1.1)
        ax.set_title(tr("{model} ({billions:.2f}B parameters)", model=model,
                        billions=sub['params (B)'].iloc[0]), fontsize=10)
        ax.set_xlabel(tr("micro-batch (sequences)"))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(tr("estimated peak (GiB)"))
    handles, labels = axes[0].get_legend_handles_labels()
    handles.append(Line2D([], [], color="black", ls=":", lw=1))
    labels.append(tr("optimizer step: weights, gradients, AdamW state + temporaries"))
    handles += [Line2D([], [], marker="o", ls="", color="gray"),
                Line2D([], [], marker="o", ls="", markerfacecolor="white", color="gray")]
    labels += [tr("peak at the optimizer step"), tr("peak in backward")]
    fig.legend(handles, labels, fontsize=8, ncol=3, loc="outside lower center", frameon=False)
    set_title(fig, title)
    return fig


def sharding_chart(table, config, ranks=(1, 2, 4, 8), title: str = "training state per rank"):
    """Per-rank training state (MiB) against the number of ranks, one colour per ZeRO stage: the
    `course_utils.memory_model.sharded_estimate` of ``config`` as a line over ``ranks`` (and the
    ranks measured), each rank of ``table`` (`course_utils.distributed.sharding_table`) as a dot.
    Raises ValueError for a table without rows."""
    if len(table) == 0:
        raise ValueError(tr("sharding_chart needs at least one measured rank."))
    xs = sorted(set(ranks) | {int(k) for k in table["ranks"]})
    fig = new_figure((6.4, 3.6))
    ax = fig.subplots()
    for stage in ZERO_STAGES:
        est = [sharded_estimate(config, k, stage).total / MiB for k in xs]
        (line,) = ax.plot(xs, est, label=tr("stage {stage}", stage=stage))
        g = table[table["ZeRO stage"] == stage]
        ax.scatter(g["ranks"], g["total"], color=line.get_color(), zorder=3, s=22)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(k) for k in xs])
    ax.set_xlabel(tr("ranks (data-parallel processes)"))
    ax.set_ylabel(tr("MiB per rank"))
    ax.set_ylim(bottom=0)
    ax.set_title(tr(title) + "\n" + tr("lines: estimate; dots: each rank's measurement"))
    ax.legend(fontsize=8, title="ZeRO", title_fontsize=8)
    return fig
