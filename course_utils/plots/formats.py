"""Lesson 01's charts of number formats and of training under them: representable ranges,
gradient histograms against a format's limits, GradScaler's trace, loss curves.
"""
from __future__ import annotations

import numpy as np
from matplotlib.ticker import MaxNLocator

from ..formats import format_info
from ..i18n import tr
from ._style import FORMAT_COLORS, SERIES, new_figure, set_title, with_size


def format_range_chart(table, title: str = "what each format can represent"):
    """Representable magnitudes of each format of ``table`` (`course_utils.formats.format_table`) on a
    log axis: the normal range solid, the subnormal range light, each bar labelled with its eps.
    Raises ValueError for a table without rows or without its columns."""
    need = {"smallest subnormal", "smallest normal", "max", "eps"}
    if len(table) == 0 or not need <= set(table.columns):
        raise ValueError(tr("format_range_chart needs a format_table() with columns {columns}.",
                            columns=sorted(need)))
    names = list(table.index)[::-1]
    fig = new_figure(figsize=(9, 0.55 * len(names) + 1.6))
    ax = fig.subplots()
    for y, name in enumerate(names):
        r = table.loc[name]
        lo, mid, hi = (np.log10(float(r[c])) for c in ("smallest subnormal", "smallest normal",
                                                       "max"))
        c = FORMAT_COLORS.get(name, "#937860")
        ax.barh(y, mid - lo, left=lo, color=c, alpha=0.35, height=0.6)
        ax.barh(y, hi - mid, left=mid, color=c, height=0.6)
        ax.annotate(f"eps = {float(r['eps']):.3g}", (hi, y), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=8)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel(tr("log10 |value|   (light: subnormal range, solid: normal range)"))
    ax.axvline(0, color="grey", lw=0.8, ls=":")
    ax.grid(axis="x", alpha=0.3)
    xmin, xmax = ax.get_xlim()
    ax.set_xlim(xmin, xmax + 0.12 * (xmax - xmin))
    ax.set_title(tr(title), fontsize=10)
    return fig


def log2_histogram_chart(hists: dict, fmt="fp16", scale: float | None = None, title: str = "",
                         size: str | None = None):
    """Histograms of ``floor(log2|g|)`` against a format's limits, one panel per histogram; the y
    axis (fraction of the nonzero values per bin) is logarithmic, so the few that round to 0 show.

    Args:
        hists: ``{name: pd.Series}`` from `course_utils.formats.log2_histogram` (index: the
            exponent bin ``k`` of ``[2^k, 2^(k+1))``, values: counts).
        fmt: the format whose limits are shaded: rounds to 0 (red), subnormal (yellow),
            overflows (purple).
        scale: if given, each histogram is drawn again shifted by ``log2(scale)`` (dashed):
            where the same values sit after loss scaling.

    Raises:
        ValueError: no histograms, or a scale that is not a positive number."""
    if not hists:
        raise ValueError(tr("log2_histogram_chart needs at least one histogram."))
    if scale is not None and not scale > 0:
        raise ValueError(tr("scale must be positive, got {scale!r}.", scale=scale))
    info = format_info(fmt)
    sub, normal, mx = (np.log2(info.smallest_subnormal), np.log2(info.smallest_normal),
                       np.log2(info.max))
    shift = np.log2(scale) if scale else 0.0
    fig = new_figure(figsize=(10, 2.6 * len(hists) + 0.6))
    axes = np.atleast_1d(fig.subplots(len(hists), 1, sharex=True))
    lo = min(int(h.index.min()) for h in hists.values())
    hi = max(int(h.index.max()) + shift for h in hists.values())
    lo, hi = min(lo, sub - 3), max(hi, mx + 2)
    for ax, (name, h) in zip(axes, hists.items()):
        k = np.asarray(h.index, dtype=float)
        total = max(1.0, float(np.sum(h.values)))
        frac = np.asarray(h.values, dtype=float) / total
        ax.axvspan(lo - 1, sub - 1, color="#C44E52", alpha=0.22, lw=0,
                   label=tr("rounds to 0 in {format}", format=info.name))
        ax.axvspan(sub - 1, normal, color="#F2B134", alpha=0.2, lw=0,
                   label=tr("{format} subnormal (fewer bits)", format=info.name))
        ax.axvspan(mx, hi + 2, color="#8172B3", alpha=0.15, lw=0,
                   label=tr("overflows to inf in {format}", format=info.name))
        ax.bar(k + 0.5, np.where(frac > 0, frac, np.nan), width=1.0, color="#4C72B0",
               label=tr(name))
        if scale:
            ax.step(np.append(k, k[-1] + 1) + shift, np.append(frac, frac[-1]), where="post",
                    color="black", ls="--", lw=1.2,
                    label=tr("the same x {scale:g} (2^{shift:g})", scale=scale, shift=shift))
        ax.set_yscale("log")
        ax.set_ylim(0.5 / total, 1.0)
        ax.set_ylabel(tr("fraction (log scale)"))
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        ax.grid(axis="y", alpha=0.3)
    axes[-1].set_xlim(lo - 1, hi + 2)
    axes[-1].set_xlabel(tr("log2 |gradient|"))
    fig.suptitle(with_size(title or tr("gradients against {format}'s range", format=info.name),
                           size), fontsize=10)
    return fig


def scaler_trace_chart(steps, scales, skipped=(), injected=(), title: str = "",
                       size: str | None = None):
    """GradScaler's scale after ``scaler.update()`` at each of ``steps`` (log2 axis), the ``skipped``
    optimizer steps and the steps where an inf/NaN was ``injected`` marked. Raises ValueError
    where ``steps`` and ``scales`` differ in length or are empty."""
    steps, scales = list(steps), [float(s) for s in scales]
    skipped, injected = list(skipped), list(injected)
    if not steps or len(steps) != len(scales):
        raise ValueError(tr("scaler_trace_chart needs as many scales as steps (at least one)."))
    fig = new_figure(figsize=(9, 3.2))
    ax = fig.subplots()
    ax.step(steps, scales, where="post", color="#4C72B0", label=tr("scale after update()"))
    at = dict(zip(steps, scales))
    for i, s in enumerate(injected):
        ax.axvline(s, color="#C44E52", alpha=0.35, lw=3,
                   label=tr("inf/NaN injected") if i == 0 else None)
    if skipped:
        ax.scatter(list(skipped), [at[s] for s in skipped], marker="x", s=80, color="black",
                   zorder=4, label=tr("optimizer step skipped"))
    ax.set_yscale("log", base=2)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(tr("step"))
    ax.set_ylabel(tr("loss scale"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(with_size(title or tr("dynamic loss scaling"), size), fontsize=10)
    return fig


def loss_curves_chart(curves: dict, title: str = "", ylabel: str = "validation loss (nats/byte)",
                      size: str | None = None, flushed: bool = False):
    """Validation loss against optimizer step, one line per run, and beside it a zoom on the second
    half or, with ``flushed=True``, the share (%) of gradients flushed to zero per step. The
    legend gives each final loss (and mean flushed share).

    Args:
        curves: ``{label: history}``: a `course_utils.training.TrainHistory` or a ``(steps,
            losses)`` pair; with ``flushed``, a `course_utils.training_arms.ArmHistory`.
        ylabel: the loss's name and unit.

    Raises:
        ValueError: no curves, a curve whose steps and losses differ in length, or, with
            ``flushed``, a history without flushed shares."""
    if not curves:
        raise ValueError(tr("loss_curves_chart needs at least one curve."))
    data, shares = {}, {}
    for label, h in curves.items():
        steps, losses = ((h.val_steps, h.val_loss) if hasattr(h, "val_loss") else h)
        steps, losses = list(steps), [float(v) for v in losses]
        if len(steps) != len(losses) or not steps:
            raise ValueError(tr("curve {label!r}: {steps} steps but {losses} losses.", label=label,
                                steps=len(steps), losses=len(losses)))
        data[label] = (steps, losses)
        if flushed:
            if not getattr(h, "flushed", None):
                raise ValueError(tr("curve {label!r} has no flushed shares (an ArmHistory of "
                                    "course_utils.training_arms.train_arms has).", label=label))
            shares[label] = (list(h.steps) or list(range(1, len(h.flushed) + 1)),
                             [100 * float(f) for f in h.flushed])
    fig = new_figure(figsize=(11, 4))
    axes = fig.subplots(1, 2)
    styles = ["-", "--", "-.", ":"]
    last = max(s[-1] for s, _ in data.values())
    for i, (label, (steps, losses)) in enumerate(data.items()):
        style, color = styles[i % len(styles)], SERIES[i % len(SERIES)]
        text = f"{tr(label)}: {losses[-1]:.3f}"
        if flushed:
            text += tr(", flushed {share:.2g}%", share=sum(shares[label][1]) / len(shares[label][1]))
        axes[0].plot(steps, losses, style, color=color, marker="o", ms=3, lw=1.6, label=text)
        if flushed:
            axes[1].plot(*shares[label], style, color=color, lw=1.6)
        else:
            keep = [j for j, s in enumerate(steps) if s >= last / 2]
            axes[1].plot([steps[j] for j in keep], [losses[j] for j in keep], style, color=color,
                         marker="o", ms=3, lw=1.6)
    for ax in axes:
        ax.set_xlabel(tr("optimizer step"))
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel(tr(ylabel))
    axes[0].set_title(tr("whole run") if not flushed else tr("validation loss"), fontsize=10)
    if flushed:
        axes[1].set_title(tr("gradients flushed to zero"), fontsize=10)
        axes[1].set_ylabel(tr("weight-gradient entries = 0 (%)"))
        axes[1].set_ylim(bottom=0)
    else:
        axes[1].set_title(tr("zoom: second half"), fontsize=10)
    fig.legend(loc="outside lower center", ncol=min(len(data), 2), fontsize=8, frameon=False,
               title=tr("run: final loss, mean flushed share") if flushed
               else tr("run: final loss"), title_fontsize=8)
    set_title(fig, title, size, fontsize=11)
    return fig
