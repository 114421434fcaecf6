"""What every chart shares: the figure type, colours, units, titles, label placement.

Nothing here keeps state: the colour tables are read-only mappings, and a figure is made per call.
"""
from __future__ import annotations

import importlib.util
import io
import textwrap
from pathlib import Path
from types import MappingProxyType

import matplotlib
import numpy as np
from matplotlib import font_manager
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox

from ..i18n import tr
from ..terms import MiB

#: Memory buckets (`Measurement` / `MemoryEstimate` field names) -> colour.
COLORS = MappingProxyType({
    "activations": "#4C72B0", "autocast_weight_copies": "#DD8452", "logits": "#55A868",
    "parameters": "#8172B3", "gradients": "#937860", "optimizer_state": "#DA8BC3"})
#: The memory buckets of a training step, in the order charts stack them.
BREAKDOWN = ("parameters", "gradients", "optimizer_state", "activations", "autocast_weight_copies",
             "logits")
#: Colours for series without a fixed meaning (one per configuration), in order.
SERIES = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860")
#: Number formats -> colour.
FORMAT_COLORS = MappingProxyType({
    "fp32": "#4C72B0", "fp16": "#DD8452", "bf16": "#55A868", "fp8 e4m3": "#C44E52",
    "fp8 e5m2": "#8172B3"})
#: Step-time bars, fp32 baselines (dashboard), failures, "not measured" notes.
TIME_COLOR, BASELINE_COLOR, ALERT_COLOR, MUTED_COLOR = "#4C72B0", "#9E9E9E", "#B71C1C", "#757575"
#: Hatch of an estimated bar.
HATCH = "//"


class ChartFigure(Figure):
    """A ``matplotlib.figure.Figure`` that shows itself as a PNG in Jupyter without pyplot: once
    when it is a cell's last expression, not after an assignment or a trailing ``;`` (a plain
    ``Figure`` shows as ``<Figure size ...>`` text unless ``%matplotlib inline`` ran)."""

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png", bbox_inches="tight")
        return buf.getvalue()


#: The font Hangul is drawn in: NanumGothic (SIL Open Font License), which the PyPI package
#: ``koreanize-matplotlib`` (MIT) ships inside its wheel, so it works offline and on Colab.
HANGUL_FONT = "NanumGothic"


def use_hangul_font() -> bool:
    """Let every chart draw Hangul: register NanumGothic and put it after the default family as a
    fallback (matplotlib >= 3.6 falls back glyph by glyph). Reads the font files of
    ``koreanize-matplotlib`` without importing it (its import changes global settings).
    Idempotent; returns False, changing nothing, where that package is missing."""
    spec = importlib.util.find_spec("koreanize_matplotlib")
    if spec is None or not spec.submodule_search_locations:
        return False
    fonts = Path(list(spec.submodule_search_locations)[0]) / "fonts"
    files = sorted(fonts.glob(f"{HANGUL_FONT}*.ttf"))  # regular, bold, extra bold, light
    if not files:
        return False
    known = {f.fname for f in font_manager.fontManager.ttflist}
    for path in files:   # every weight: a bold title finds a bold face, with no warning
        if str(path) not in known:
            font_manager.fontManager.addfont(str(path))
    family = list(matplotlib.rcParams["font.family"])
    if family == ["sans-serif"]:
        family = list(matplotlib.rcParams["font.sans-serif"][:1])
    if HANGUL_FONT not in family:
        matplotlib.rcParams["font.family"] = family + [HANGUL_FONT]
    return True


def new_figure(figsize, **kwargs) -> ChartFigure:
    """A `ChartFigure` with an Agg canvas and constrained layout (room for ``fig.legend(loc="outside
    ...")`` and the title), able to draw Hangul (`use_hangul_font`)."""
    use_hangul_font()
    kwargs.setdefault("layout", "constrained")
    fig = ChartFigure(figsize=figsize, **kwargs)
    FigureCanvasAgg(fig)
    return fig


def bucket_name(kind: str) -> str:
    """A memory bucket (a `Measurement` field) as a legend names it, in the learner's language."""
    return {"parameters": tr("parameters"), "gradients": tr("gradients"),
            "optimizer_state": tr("AdamW state"), "activations": tr("activations"),
            "autocast_weight_copies": tr("autocast weight copies"),
            "logits": tr("logits + loss")}[kind]


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
    """``title`` in the learner's language (`course_utils.i18n.tr`) followed by the size profile
    (``"size 'cpu'"``) unless it already names it."""
    title = tr(title) if title else title
    tag = tr("size '{size}'", size=size)
    if not size or f"size '{size}'" in title or tag in title:
        return title
    return f"{title}, {tag}" if title else tag


def set_title(fig, title: str, size: str | None = None, **kwargs) -> None:
    """The figure's title (with the size profile), if there is one."""
    text = with_size(title, size)
    if text:
        fig.suptitle(text, **kwargs)


def overlaps(a, b, pad: float = 0.0) -> bool:
    """Whether two display-space bounding boxes overlap (``pad`` pixels of margin)."""
    return not (a.x1 + pad <= b.x0 or b.x1 + pad <= a.x0 or a.y1 + pad <= b.y0 or b.y1 + pad <= a.y0)


#: Offsets (points) tried in turn for a point's label: right-above, right-below, left-above, ...,
#: each ring 12 points further out; from `LEADER_FROM` on, a leader line joins label and point.
LABEL_OFFSETS = tuple((dx, dy, "left" if dx > 0 else "right") for k in range(4)
                      for dx, dy in ((6, 5 + 12 * k), (6, -13 - 12 * k), (-6, 5 + 12 * k),
                                     (-6, -13 - 12 * k)))
LEADER_FROM = 4
#: Half the size (points) of the box around a marker or an error bar a label must not cover.
MARKER_PAD = 4.5


def _point_boxes(ax, points, renderer):
    """Display-space boxes of each point's marker and horizontal error bar (``points``: ``(x, y,
    x_low, x_high)`` in data coordinates)."""
    pad = MARKER_PAD * renderer.points_to_pixels(1.0)
    boxes = []
    for x, y, lo, hi in points:
        (px, py), (plo, _), (phi, _) = ax.transData.transform([(x, y), (lo, y), (hi, y)])
        boxes += [Bbox([[px - pad, py - pad], [px + pad, py + pad]]),
                  Bbox([[min(plo, phi), py - pad * 0.7], [max(plo, phi), py + pad * 0.7]])]
    return boxes


def _distance(box, p) -> float:
    """Display distance from point ``p`` to the box (0 inside it)."""
    return float(np.hypot(max(box.x0 - p[0], 0, p[0] - box.x1),
                          max(box.y0 - p[1], 0, p[1] - box.y1)))


def place_point_labels(fig, ax, texts, points=None) -> None:
    """Move each of ``texts`` (annotations, ``textcoords="offset points"``) to the first of
    `LABEL_OFFSETS` where it stays inside the axes, overlaps no label placed before it, covers no
    marker or error bar and is nearer its own point than any other (``points``: one ``(x, y,
    x_low, x_high)`` per text, data coordinates), else to the one that breaks fewest of these.
    Call it last: it lays the figure out to measure."""
    if fig.get_layout_engine() is not None:
        fig.get_layout_engine().execute(fig)
    renderer = fig.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    obstacles = _point_boxes(ax, points or [], renderer)
    anchors = ax.transData.transform([(x, y) for x, y, _, _ in points]) if points else []
    placed = []
    for n, text in enumerate(texts):
        best = None
        for k, (dx, dy, ha) in enumerate(LABEL_OFFSETS):
            text.xyann = (dx, dy)
            text.set_horizontalalignment(ha)
            box = text.get_window_extent(renderer)
            outside = not (inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1))
            cost = (sum(overlaps(box, other, pad=1) for other in placed)
                    + 3 * sum(overlaps(box, o) for o in obstacles) + 10 * outside)
            if len(anchors):  # nearer another point than its own: it reads as that one's label
                near = [_distance(box, p) for p in anchors]
                cost += 3 * any(d <= near[n] for i, d in enumerate(near) if i != n)
            if best is None or cost < best[0]:
                best = (cost, k, dx, dy, ha)
            if cost == 0:
                break
        _, k, dx, dy, ha = best
        text.xyann = (dx, dy)
        text.set_horizontalalignment(ha)
        box = text.get_window_extent(renderer)
        placed.append(box)
        if k >= LEADER_FROM:  # far from its point: a thin line from the label's near edge to it
            px, py = ax.transData.transform(text.xy)
            ex, ey = (box.x0 if dx > 0 else box.x1), (box.y0 if dy > 0 else box.y1)
            gap = MARKER_PAD * renderer.points_to_pixels(1.0)
            dist = np.hypot(ex - px, ey - py)
            sx, sy = px + (ex - px) * gap / dist, py + (ey - py) * gap / dist  # off the marker
            (x0, y0), (x1, y1) = ax.transData.inverted().transform([(sx, sy), (ex, ey)])
            ax.plot([x0, x1], [y0, y1], "-", color="#888888", lw=0.7, zorder=2.5,
                    label="_leader line")


def put_caption(fig, text: str, width: int = 150) -> None:
    """``text`` under the chart: as the title of the figure's legend below the panels when it
    has one (so the two do not overlap), else as the figure's x label."""
    wrapped = textwrap.fill(text, width)
    if fig.legends:
        legend = fig.legends[-1]
        legend.set_title(wrapped, prop={"size": 8})
        legend.get_title().set_color(MUTED_COLOR)
    else:
        fig.supxlabel(wrapped, fontsize=8, color=MUTED_COLOR)
