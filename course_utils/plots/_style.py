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


#: The font Hangul is drawn in: NanumGothic (SIL Open Font License), which the PyPI package
#: ``koreanize-matplotlib`` (MIT) ships inside its wheel, so it works offline and on Colab.
HANGUL_FONT = "NanumGothic"


def use_hangul_font() -> bool:
    """Let every chart draw Hangul: register NanumGothic with matplotlib's font manager and put
    it after the default family as a fallback (matplotlib >= 3.6 falls back glyph by glyph), so
    English text keeps its font and Korean text gets NanumGothic instead of empty boxes. Reads
    the font file from ``koreanize-matplotlib`` without importing it (its import changes global
    settings). Idempotent; returns False, changing nothing, where that package is missing."""
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
    """A `ChartFigure` with an Agg canvas and constrained layout (which reserves room for
    legends placed outside the axes, ``fig.legend(loc="outside ...")``, and for the title), able
    to draw Hangul (`use_hangul_font`)."""
    use_hangul_font()
    kwargs.setdefault("layout", "constrained")
    fig = ChartFigure(figsize=figsize, **kwargs)
    FigureCanvasAgg(fig)
    return fig


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
    """``title`` in the learner's language (`course_utils.i18n.tr`: a caller's title that the
    catalog holds is translated, any other stays as given) followed by the size profile
    (``"size 'cpu'"``) unless it already names it."""
    title = tr(title) if title else title
    if not size:
        return title
    if f"size '{size}'" in title:
        return title
    tag = tr("size '{size}'", size=size)
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
#: The first four touch the point; the others are joined to it by a leader line.
LABEL_OFFSETS = ((6, 5, "left"), (6, -13, "left"), (-6, 5, "right"), (-6, -13, "right"),
                 (6, 17, "left"), (6, -25, "left"), (-6, 17, "right"), (-6, -25, "right"),
                 (6, 29, "left"), (6, -37, "left"), (-6, 29, "right"), (-6, -37, "right"),
                 (6, 41, "left"), (6, -49, "left"), (-6, 41, "right"), (-6, -49, "right"))
#: Offsets from this one on are far from the point: a leader line joins label and point.
LEADER_FROM = 4
#: Half the size (points) of the box around a marker or an error bar a label must not cover.
MARKER_PAD = 4.5


def _point_boxes(ax, points, renderer):
    """Display-space boxes of each point's marker and horizontal error bar: ``points`` holds
    ``(x, y, x_low, x_high)`` in data coordinates (``x_low``/``x_high`` the bar's ends, or x)."""
    pad = MARKER_PAD * renderer.points_to_pixels(1.0)
    boxes = []
    for x, y, lo, hi in points:
        (px, py), (plo, _), (phi, _) = ax.transData.transform([(x, y), (lo, y), (hi, y)])
        boxes.append([Bbox([[px - pad, py - pad], [px + pad, py + pad]]),
                      Bbox([[min(plo, phi), py - pad * 0.7], [max(plo, phi), py + pad * 0.7]])])
    return boxes


def _distance(box, p) -> float:
    """Display distance from point ``p`` to the box (0 inside it)."""
    return float(np.hypot(max(box.x0 - p[0], 0, p[0] - box.x1),
                          max(box.y0 - p[1], 0, p[1] - box.y1)))


def place_point_labels(fig, ax, texts, points=None) -> None:
    """Move each of ``texts`` (annotations of points, ``textcoords="offset points"``) to the
    first of `LABEL_OFFSETS` where it stays inside the axes, overlaps no label placed before
    it and covers no point's marker or error bar (``points``: one ``(x, y, x_low, x_high)`` per
    text, in data coordinates; a label over another point's marker, or nearer another point than
    its own, reads as that point's label), else to the one that does fewest of these. A label
    placed at `LEADER_FROM` or beyond is joined to its point by a leader line. Call it last: it
    lays the figure out to measure."""
    renderer = lay_out(fig)
    inside = ax.get_window_extent(renderer)
    obstacles = [b for pair in _point_boxes(ax, points or [], renderer) for b in pair]
    anchors = ax.transData.transform([(x, y) for x, y, _, _ in points]) if points else []
    placed = []
    for n, text in enumerate(texts):
        best = None
        for k, (dx, dy, ha) in enumerate(LABEL_OFFSETS):
            text.xyann = (dx, dy)
            text.set_horizontalalignment(ha)
            box = text.get_window_extent(renderer)
            outside = not (box.x0 >= inside.x0 and box.x1 <= inside.x1 and box.y0 >= inside.y0
                           and box.y1 <= inside.y1)
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
            ex = box.x0 if dx > 0 else box.x1
            ey = box.y0 if dy > 0 else box.y1
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
