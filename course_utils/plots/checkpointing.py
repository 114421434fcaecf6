"""Lesson 02's checkpointing charts: saved bytes and peak against segments, attention memory
against sequence length.
"""
from __future__ import annotations

import numpy as np
from matplotlib.ticker import FuncFormatter

from ..i18n import tr
from ..terms import MiB
from ._style import mib, new_figure, set_title, with_size


def segments_chart(df, n_layers: int, title: str = "", size: str | None = None):
    """Saved bytes and peak memory (MiB) against the number of checkpointed segments (log2 axis), a
    dotted line at ``sqrt(n_layers)``. The first method is a thick pale line under the others, so
    two methods that measure the same bytes both show.

    ``df``: one row per (method, segments): ``method``, ``segments``, ``saved_bytes``,
    ``peak_bytes`` (bytes) and optionally ``est_saved``/``est_peak`` (a model, drawn dashed).
    Raises ValueError for missing columns or no rows."""
    need = {"method", "segments", "saved_bytes", "peak_bytes"}
    if len(df) == 0 or need - set(df.columns):
        raise ValueError(tr("segments_chart needs rows with columns {columns}.",
                            columns=sorted(need)))
    fig = new_figure((11, 4.6))
    axes = fig.subplots(1, 2)
    colors = ["#4C72B0", "#C44E52", "#55A868", "#8172B3"]
    for ax, col, est, name in ((axes[0], "saved_bytes", "est_saved", tr("saved for backward")),
                               (axes[1], "peak_bytes", "est_peak",
                                tr("peak during forward + backward"))):
        for i, (method, d) in enumerate(df.groupby("method", sort=False)):
            d = d.sort_values("segments")
            c = colors[i % len(colors)]
            ax.plot(d["segments"], mib(d[col]), "-", color=c, lw=4.5 if i == 0 else 1.4,
                    alpha=0.6 if i == 0 else 1.0, marker="os^D"[i % 4], ms=12 if i == 0 else 5,
                    mfc="white" if i == 0 else c, mew=2.0, zorder=3 + i,
                    label=tr("{method} (measured)", method=tr(method)))
            if est in d.columns and d[est].notna().any():
                ax.plot(d["segments"], mib(d[est]), "--", color=c, lw=1.4, alpha=0.9, zorder=10,
                        label=tr("{method} (model)", method=tr(method)))
        ax.axvline(np.sqrt(n_layers), color="grey", linestyle=":", linewidth=1.2)
        ax.annotate(f"sqrt(N) = {np.sqrt(n_layers):.1f}", (np.sqrt(n_layers), 1.0),
                    xycoords=("data", "axes fraction"), xytext=(3, -12),
                    textcoords="offset points", fontsize=8, color="grey")
        ax.set_xscale("log", base=2)
        segs = sorted({int(s) for s in df["segments"]})
        ax.set_xticks(segs, [str(s) for s in segs])
        ax.set_xlabel(tr("segments (N = {n_layers} blocks)", n_layers=n_layers))
        ax.set_ylabel("MiB")
        ax.set_ylim(bottom=0)
        ax.set_title(name)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    set_title(fig, title, size)
    return fig


def attention_memory_chart(df, title: str = "saved bytes of one block vs sequence length",
                           size: str | None = None):
    """Log-log saved bytes (MiB) against sequence length (tokens), one line per attention
    implementation; the legend gives each measured line's slope between its last two points (1:
    linear, 2: quadratic).

    ``df``: ``attention``, ``seq_len``, ``saved_bytes`` and optionally ``est_bytes`` (an estimate,
    dashed over the measured markers). Raises ValueError for missing columns or no rows."""
    need = {"attention", "seq_len", "saved_bytes"}
    if len(df) == 0 or need - set(df.columns):
        raise ValueError(tr("attention_memory_chart needs rows with columns {columns}.",
                            columns=sorted(need)))
    fig = new_figure((9.5, 4.6))
    ax = fig.subplots()
    colors = {"naive": "#C44E52", "sdpa": "#4C72B0"}
    others = iter(["#8172B3", "#55A868", "#937860", "#DA8BC3"])
    for key, d in df.groupby("attention", sort=False):
        d, name = d.sort_values("seq_len"), tr(key)
        x, y = d["seq_len"].to_numpy(float), d["saved_bytes"].to_numpy(float)
        slope = (np.log(y[-1] / y[-2]) / np.log(x[-1] / x[-2])) if len(x) > 1 else np.nan
        c = colors.get(key) or next(others, None)
        ax.plot(x, y / MiB, "o-", color=c, lw=1.0, ms=8, mfc="white", mew=1.6, zorder=3,
                label=tr("{name}: measured (slope {slope:.2f})", name=name, slope=slope))
        if "est_bytes" in d.columns and d["est_bytes"].notna().any():
            ax.plot(x, mib(d["est_bytes"]), "--", color=c, lw=1.8, alpha=0.85, zorder=4,
                    label=tr("{name}: estimate", name=name))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    xs = sorted({int(v) for v in df["seq_len"]})
    ax.set_xticks(xs, [str(v) for v in xs])
    ax.set_xlabel(tr("sequence length (tokens)"))
    ax.set_ylabel(tr("saved for backward (MiB, log scale)"))
    ax.set_title(with_size(title, size))
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fig
