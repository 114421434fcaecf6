"""Charts of the course: measured vs estimated time and memory (matplotlib).

Every function returns a ``matplotlib.figure.Figure`` and draws only what it is given.
"""
from __future__ import annotations

import matplotlib

if matplotlib.get_backend().lower() == "agg" or not matplotlib.rcParams.get("backend"):
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

__all__ = ["comparison_chart", "MiB"]

MiB = 2**20
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
    for xi, ratio in zip(x, df["time_ratio"]):
        if ratio is not None and not np.isnan(_nan(ratio)):
            ax.annotate(f"{ratio:.2f}x", (xi, 0), xytext=(0, 3), textcoords="offset points",
                        ha="center", color="white", fontsize=8)

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
