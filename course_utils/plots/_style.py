"""What every chart shares: the figure type, colours, units, titles, label placement.

Nothing here keeps state: the colour tables are read-only mappings, and a figure is made per call.
"""
from __future__ import annotations

import io
from types import MappingProxyType

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..terms import MiB

#: Memory buckets (`Measurement` / `MemoryEstimate` field names) -> colour.
COLORS = MappingProxyType({
    "activations": "#4C72B0", "autocast_weight_copies": "#DD8452", "logits": "#55A868",
    "parameters": "#8172B3", "gradients": "#937860", "optimizer_state": "#DA8BC3"})
#: Colours for series without a fixed meaning (one per configuration), in order.
SERIES = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860")
#: Number formats -> colour.
FORMAT_COLORS = MappingProxyType({
    "fp32": "#4C72B0", "fp16": "#DD8452", "bf16": "#55A868", "fp8 e4m3": "#C44E52",
    "fp8 e5m2": "#8172B3"})
#: Step-time bars, fp32 baselines (dashboard), failures, "not measured" notes.
TIME_COLOR, BASELINE_COLOR, ALERT_COLOR, MUTED_COLOR = "#4C72B0", "#9E9E9E", "#B71C1C", "#757575"
#: Hatch of an estimated bar, and of a bar timed under emulation (not the hardware's real speed).
HATCH, EMULATED_HATCH = "//", "xx"


class ChartFigure(Figure):
    """A ``matplotlib.figure.Figure`` that displays itself in Jupyter without pyplot.

    A plain ``Figure`` (not made by pyplot) shows as ``<Figure size ...>`` text in a kernel
    unless ``%matplotlib inline`` has registered matplotlib's formatter; this one gives IPython
    a PNG through ``_repr_png_``, so a chart shows exactly once when it is a cell's last
    expression (with or without ``%matplotlib inline``, whose formatter then takes precedence)
    and not at all after an assignment or a trailing ``;``. ``display(fig)`` shows it anywhere.
    Its canvas is Agg's, so ``fig.canvas.get_renderer()`` and ``fig.savefig`` work headless.
    """

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png", bbox_inches="tight")
        return buf.getvalue()


def new_figure(figsize, **kwargs) -> ChartFigure:
    """A `ChartFigure` with an Agg canvas and constrained layout (which reserves room for
    legends placed outside the axes, ``fig.legend(loc="outside ...")``, and for the title)."""
    kwargs.setdefault("layout", "constrained")
    fig = ChartFigure(figsize=figsize, **kwargs)
    FigureCanvasAgg(fig)
    return fig


def emulated_handle(color=TIME_COLOR):
    """A legend entry for hatched "emulated here" bars."""
    return Patch(facecolor="white", edgecolor=color, hatch=EMULATED_HATCH,
                 label="emulated here (not this hardware's real speed)")


def nan(v) -> float:
    """``v`` as a float; None (a value a backend could not give) as NaN."""
    return np.nan if v is None else float(v)


def mib(values) -> np.ndarray:
    """Bytes (None allowed) -> MiB (2^20 bytes) as a float array, None -> NaN."""
    return np.array([nan(v) / MiB for v in values], dtype=float)


def column(df, name, default=np.nan) -> list:
    """``df[name]`` as a list, or ``default`` for every row when the column is absent (old tables)."""
    return list(df[name]) if name in df.columns else [default] * len(df)


def with_size(title: str, size: str | None) -> str:
    """``title`` followed by the size profile (``"size 'cpu'"``) unless it already names it."""
    if not size:
        return title
    tag = f"size '{size}'"
    if tag in title:
        return title
    return f"{title}, {tag}" if title else tag


def set_title(fig, title: str, size: str | None = None, **kwargs) -> None:
    """The figure's title (with the size profile), if there is one."""
    text = with_size(title, size)
    if text:
        fig.suptitle(text, **kwargs)


def lay_out(fig):
    """Run ``fig``'s layout (positions final, nothing drawn) and return a renderer to measure
    texts with: for labels placed by their measured size."""
    engine = fig.get_layout_engine()
    if engine is not None:
        engine.execute(fig)
    return fig.canvas.get_renderer()


def overlaps(a, b, pad: float = 0.0) -> bool:
    """Whether two display-space bounding boxes overlap (``pad`` pixels of margin)."""
    return not (a.x1 + pad <= b.x0 or b.x1 + pad <= a.x0 or a.y1 + pad <= b.y0 or b.y1 + pad <= a.y0)


#: Offsets (points) tried in turn for a point's label: right-above, right-below, left-above, ...
LABEL_OFFSETS = ((6, 5, "left"), (6, -13, "left"), (-6, 5, "right"), (-6, -13, "right"),
                 (6, 17, "left"), (6, -25, "left"), (-6, 17, "right"), (-6, -25, "right"),
                 (6, 29, "left"), (6, -37, "left"))


def place_point_labels(fig, ax, texts) -> None:
    """Move each of ``texts`` (annotations of points, ``textcoords="offset points"``) to the
    first of `LABEL_OFFSETS` where it stays inside the axes and overlaps no label placed before
    it (else to the one that overlaps fewest). Call it last: it lays the figure out to measure."""
    renderer = lay_out(fig)
    inside = ax.get_window_extent(renderer)
    placed = []
    for text in texts:
        best = None
        for dx, dy, ha in LABEL_OFFSETS:
            text.xyann = (dx, dy)
            text.set_horizontalalignment(ha)
            box = text.get_window_extent(renderer)
            outside = not (box.x0 >= inside.x0 and box.x1 <= inside.x1 and box.y0 >= inside.y0
                           and box.y1 <= inside.y1)
            cost = sum(overlaps(box, other, pad=1) for other in placed) + 10 * outside
            if best is None or cost < best[0]:
                best = (cost, dx, dy, ha)
            if cost == 0:
                break
        _, dx, dy, ha = best
        text.xyann = (dx, dy)
        text.set_horizontalalignment(ha)
        placed.append(text.get_window_extent(renderer))
