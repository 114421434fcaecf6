"""course_utils.plots: every chart is a Figure made without pyplot, shows once in a kernel, keeps
its labels clear of its bars, and never prints a bare time ratio for a difference inside the noise.

The inputs are small hand-built tables with the columns the charts read (values from a real
`compare` run at the 'cpu' profile on a CPU without native bf16, where bf16 is emulated).
"""
from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace as NS

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import arm_history, measured_table, x_like
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.transforms import Bbox
from torch.utils.checkpoint import checkpoint

from course_utils import distributed, lora, memory_model, plots
from course_utils.config import config_for
from course_utils.experiments import plain_label
from course_utils.formats import FORMATS, format_table, log2_histogram
from course_utils.memory_model import sharded_estimate
from course_utils.memory_timeline import memory_timeline
from course_utils.plots.ladder import adoption_story
from course_utils.saved_tensors import saved_by_module
from course_utils.terms import MiB

RATIO = re.compile(r"\d+\.\d+x")


# ------------------------------------------------------------------------------------ inputs

def compare_table(noise: bool = True) -> pd.DataFrame:
    """A `compare` table of lesson 03's ladder; ``noise``: with the engine's newer columns."""
    rows = []
    for label, t, iqr, peak, est_peak, acts, copies, logits in (
            ("fp32", 0.382, 0.002, 114.7, 113.0, 64.0, 0.0, 3.1),
            ("bf16", 1.461, 0.0, 92.7, 89.4, 36.2, 6.0, 2.6),
            ("bf16+full", 1.803, 0.0, 69.1, 60.3, 4.0, 0.4, 2.6),
            ("bf16+selective", 0.390, 0.004, 79.1, 75.6, 24.0, 0.3, 2.6)):
        row = {"label": label, "step_time_s": t, "step_time_iqr_s": iqr, "time_ratio": t / 0.382,
               "peak_allocated": peak * MiB, "est_peak_allocated": est_peak * MiB,
               "activations": acts * MiB, "autocast_weight_copies": copies * MiB,
               "logits": logits * MiB, "est_saved_total": (acts + copies + logits) * MiB}
        for k, v in (("parameters", 12.7), ("gradients", 12.7), ("optimizer_state", 25.3)):
            row[k] = row["est_" + k] = v * MiB
        for k in ("activations", "autocast_weight_copies", "logits"):
            row["est_" + k] = row[k]
        rows.append(row)
    df = pd.DataFrame(rows)
    if noise:
        df["time_ratio_low"] = df["time_ratio"] * 0.95
        df["time_ratio_high"] = df["time_ratio"] * 1.05
        df["time_verdict"] = ["within noise", "emulated", "emulated", "within noise"]
        df["emulated"] = [False, True, True, False]
    return df


def policy_table() -> pd.DataFrame:
    """Lesson 02's `compare` of checkpoint policies (smoke profile): labels that crowd."""
    return pd.DataFrame({
        "label": ["fp32", "fp32+full", "fp32+every-2", "fp32+segments:2", "fp32+selective"],
        "step_time_s": [0.01279, 0.01607, 0.01340, 0.01650, 0.02162],
        "step_time_iqr_s": [0.00208, 0.00098, 0.00082, 0.00137, 0.00079],
        "time_ratio": [1.0, 1.256, 1.047, 1.289, 1.690],
        "time_verdict": ["within noise", "slower", "within noise", "slower",
                         "too small to time"],
        "peak_allocated": [3266944, 2780480, 2780480, 2780480, 2979840]})


def history() -> pd.DataFrame:
    """`Dashboard.history`: a baseline, an emulated run, one within noise, one slower, an OOM."""
    base = compare_table().iloc[0]
    rows = []
    for run, label, ratio, verdict, emulated, status in (
            (1, "fp32", 1.0, None, False, "ok"), (2, "bf16", 3.8, "emulated", True, "ok"),
            (3, "fp32+full", 1.03, "within noise", False, "ok"),
            (4, "fp32+selective", 1.31, "slower", False, "ok"),
            (5, "fp32 b64", np.nan, "not timed", False, "OOM")):
        ok = status == "ok"
        row = {"run": run, "label": label, "baseline": run == 1, "status": status,
               "batch_size": 8, "seq_len": 128, "n_layers": 4, "baseline_run": 1,
               "step_time_s": base.step_time_s * ratio, "time_ratio": ratio,
               "peak_ratio": 1.0 if ok else np.nan, "time_verdict": verdict, "emulated": emulated}
        for k in ("parameters", "gradients", "optimizer_state", "activations",
                  "autocast_weight_copies", "logits", "peak_allocated"):
            row[k] = base[k] if ok else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def story() -> pd.DataFrame:
    """`adoption_story`'s table, made up: each step against the one before it."""
    return pd.DataFrame({"step": ["fp32", "+ bf16 autocast", "+ full ckpt", "+ sharding over 4 GPUs"],
                         "step_time_s": [0.38, 0.39, 0.47, np.nan],
                         "peak_allocated": [114e6, 92e6, 69e6, 40e6],
                         "source": ["measured", "measured", "measured", "estimate"],
                         "vs": [None, "fp32", "+ bf16 autocast", "+ full ckpt"],
                         "peak_ratio": [np.nan, 92 / 114, 69 / 92, 40 / 69],
                         "time_verdict": [None, "within noise", "slower", None]})


def searches() -> list:
    def probe(b, peak, fits, tps):
        return NS(batch_size=b, peak_allocated=peak * MiB, fits=fits, tokens_per_s=tps)
    return [NS(label="fp32", budget_bytes=100 * MiB, batch_size=6, tokens_per_s=5200.0,
               estimated=[(b, (20 + 13 * b) * MiB) for b in range(1, 9)],
               probes=[probe(4, 72, True, 5000.0), probe(6, 98, True, 5200.0),
                       probe(7, 111, False, None)]),
            NS(label="bf16+full", budget_bytes=100 * MiB, batch_size=14, tokens_per_s=4100.0,
               estimated=[(b, (22 + 5.4 * b) * MiB) for b in range(1, 17)],
               probes=[probe(8, 65, True, 3900.0), probe(14, 97, True, 4100.0),
                       probe(16, 108, False, None)])]


def race() -> NS:
    """`search.race`'s result: plain bf16 at batch 3, full checkpointing at 8 (faster per token
    outside the noise), selective at 5 (within noise); per-step ratios to the first row."""
    return NS(table=pd.DataFrame({
        "label": ["bf16", "bf16+full", "bf16+selective"], "batch_size": [3, 8, 5],
        "grad_accum_steps": [1, 1, 1], "step_time_s": [0.0608, 0.127, 0.102],
        "tokens_per_s": [6316.0, 8063.0, 6275.0], "time_ratio": [1.0, 2.17, 1.68],
        "time_ratio_low": [1.0, 2.02, 1.55], "time_ratio_high": [1.0, 2.32, 1.80],
        "time_verdict": ["reference", "slower", "slower"], "emulated": [False] * 3}))


def growth() -> pd.DataFrame:
    """Lesson 02's growth table: measured saved bytes equal to their estimate."""
    rows = []
    for sweep, values in (("batch_size", (2, 4, 8, 16)), ("seq_len", (16, 32, 64, 128))):
        for v in values:
            b, t = (v, 64) if sweep == "batch_size" else (8, v)
            saved = 34_930 * b * t
            rows.append({"sweep": sweep, "batch_size": b, "seq_len": t, "saved": saved,
                         "est_saved": saved, "static": 13873364.0 if (b, t) == (8, 64) else np.nan,
                         "est_static": 13873364.0 + 1536 * (t - 64)})
    return pd.DataFrame(rows)


def saved_table(scale: int) -> pd.DataFrame:
    return pd.DataFrame({"module": ["ln1", "attn.qkv", "attn", "mlp.fc1", "mlp.act", ""],
                         "module_type": ["LayerNorm", "Linear", "Attention", "Linear", "GELU",
                                         "Block"],
                         "shape": [(4, 32, 64), (4, 32, 64), (4, 32, 192), (4, 32, 64),
                                   (4, 32, 256), (4, 32, 64)],
                         "nbytes": [32768 * scale, 32768, 98304, 32768, 131072, 32768]})


def timeline() -> NS:
    phases = [NS(name="forward", start_ms=0.0, end_ms=4.0), NS(name="backward", start_ms=4.0,
                                                               end_ms=9.0),
              NS(name="optimizer", start_ms=9.0, end_ms=10.0)]
    return NS(t_ms=list(np.linspace(0, 10, 21)),
              allocated=[int(v) for v in np.r_[np.linspace(0, 8, 9), np.linspace(7, 1, 12)] * MiB],
              phases=phases)


def charts():
    """(name, call) for every public chart function, with realistic small inputs."""
    fmt = pd.DataFrame({"smallest subnormal": [1.4e-45, 5.96e-08, 9.2e-41],
                        "smallest normal": [1.18e-38, 6.1e-05, 1.18e-38],
                        "max": [3.4e38, 65504.0, 3.39e38], "eps": [1.19e-07, 9.77e-04, 7.8e-03]},
                       index=["fp32", "fp16", "bf16"])
    hist = pd.Series([5, 40, 300, 900, 400, 20], index=range(-30, -24))
    seg = pd.DataFrame([{"method": m, "segments": s, "saved_bytes": s * MiB,
                         "peak_bytes": (s + 8 / s) * MiB} for m in ("loop", "checkpoint_sequential")
                        for s in (1, 2, 4, 8)])
    att = pd.DataFrame([{"attention": a, "seq_len": t, "saved_bytes": t * (t if a == "naive" else 1)}
                        for a in ("naive", "sdpa") for t in (8, 16, 32)])
    claims = pd.DataFrame({"says": ["bf16 cuts memory"], "status": ["held"],
                           "evidence": ["peak 0.81x"], "where": ["[01 §6](#6)"]},
                          index=pd.Index(["C2"], name="claim"))
    return [
        ("comparison_chart", lambda: figure("ladder")),
        ("dashboard_chart", lambda: figure("dashboard")),
        ("adoption_chart", lambda: plots.adoption_chart(story())),
        ("pareto_chart", lambda: figure("pareto")),
        ("budget_chart", lambda: plots.budget_chart(searches())),
        ("race_chart", lambda: plots.race_chart(race())),
        ("format_range_chart", lambda: plots.format_range_chart(fmt)),
        ("log2_histogram_chart", lambda: plots.log2_histogram_chart({"grads": hist}, "fp16",
                                                                    scale=2.0**16)),
        ("scaler_trace_chart", lambda: plots.scaler_trace_chart([1, 2, 3, 4], [4.0, 2.0, 2.0, 4.0],
                                                                skipped=[2], injected=[2])),
        ("loss_curves_chart", lambda: plots.loss_curves_chart({"fp32": ([0, 10, 20], [5.5, 3.1, 2.6]),
                                                               "bf16": ([0, 10, 20], [5.5, 3.2, 2.6])})),
        ("memory_breakdown_chart", lambda: plots.memory_breakdown_chart(compare_table())),
        ("saved_tensors_chart", lambda: plots.saved_tensors_chart({"block(x)": saved_table(1),
                                                                   "checkpoint": saved_table(0)})),
        ("memory_growth_chart", lambda: figure("growth")),
        ("memory_timeline_chart", lambda: plots.memory_timeline_chart({"none": timeline(),
                                                                       "full": timeline()})),
        ("scale_chart", lambda: figure("scale")),
        ("segments_chart", lambda: plots.segments_chart(seg, n_layers=8)),
        ("attention_memory_chart", lambda: plots.attention_memory_chart(att)),
        ("styled_claims", lambda: plots.styled_claims(claims)),
        ("routes_chart", lambda: plots.routes_chart(lora.routes(), gpu_gib=24, size="cpu")),
        ("sharding_chart", lambda: plots.sharding_chart(sharding_table(), SHARDED)),
    ]


#: The model whose per-rank training state `sharding_table` holds.
SHARDED = config_for("smoke", device="cpu")


def sharding_table():
    """`course_utils.distributed.sharding_table` of two ranks at ZeRO stages 0 and 3, each
    rank measured at exactly the estimate."""
    reports = [{"world_size": 2, "rank": r, "stages": {
        s: {k: getattr(sharded_estimate(SHARDED, 2, s), k)
            for k in ("parameters", "gradients", "optimizer_state")} for s in (0, 3)}}
        for r in (0, 1)]
    return distributed.sharding_table(reports, SHARDED)


@functools.cache
def figure(name: str):
    """The standard inputs' figure of a chart, built once per test run (tests only read it)."""
    return {"ladder": lambda: plots.comparison_chart(compare_table(), title="the ladder", size="cpu"),
            "measure": lambda: plots.comparison_chart(compare_table(noise=False).iloc[:2],
                                                      title="Intel Xeon", size="cpu"),
            "pareto": lambda: plots.pareto_chart(policy_table(), size="smoke"),
            "dashboard": lambda: plots.dashboard_chart(history()),
            "growth": lambda: plots.memory_growth_chart(growth()),
            "scale": lambda: plots.scale_chart(memory_model.scale_sweep(),
                                               gpus={"24 GiB GPU": 24, "80 GiB GPU": 80}),
            }[name]()


# ------------------------------------------------------------------------------------ helpers

def _layout(fig):
    """The renderer of ``fig`` laid out (once: the figures are not changed after)."""
    if not getattr(fig, "_laid_out_for_test", False):
        fig.get_layout_engine().execute(fig)  # positions as drawn, without drawing
        fig._laid_out_for_test = True
    return fig.canvas.get_renderer()


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _bars(ax):
    return [p for p in ax.patches if isinstance(p, Rectangle) and p.get_width() and p.get_height()]


def _whiskers(ax) -> list[tuple[float, float]]:
    """(bottom, top) of each drawn error bar of ``ax``, left to right."""
    out = []
    for c in ax.containers:
        if getattr(c, "has_yerr", False):
            for seg in c.lines[2][0].get_segments():
                out.append((seg[0][0], min(seg[0][1], seg[1][1]), max(seg[0][1], seg[1][1])))
    return [(lo, hi) for _, lo, hi in sorted(out)]


def _legends(fig):
    return list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]


def _assert_legends_clear(fig):
    """No legend covers a bar, an annotation or a line's data of any panel."""
    r = _layout(fig)
    for leg in _legends(fig):
        box = leg.get_window_extent(r)
        for ax in fig.axes:
            for bar in _bars(ax):
                assert not _overlap(box, bar.get_window_extent(r)), \
                    f"legend covers a bar in {ax.get_title()!r}"
            for text in ax.texts:
                assert not _overlap(box, text.get_window_extent(r)), f"legend covers {text.get_text()!r}"


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


# ------------------------------------------------------------------------------------ tests

# A fresh kernel (a fresh process) imports the package, calls every chart, then shows one: it
# starts with the first test of this module and runs beside the others (torch's import alone
# takes seconds); test_no_pyplot_and_one_inline_image_in_a_kernel reads what it printed.
KERNEL_TEST = "test_no_pyplot_and_one_inline_image_in_a_kernel"
KERNEL_CELLS = [
    ("import sys\nsys.path[:0] = ['.', 'tests']\nimport test_plots\n"
     "outs = [call() for _, call in test_plots.charts()]\n"
     "fig = test_plots.plots.scaler_trace_chart([1, 2, 3], [4.0, 2.0, 4.0])"),
    "fig",                                  # the chart as the cell's last expression
    "fig;",                                 # a trailing ';' hides it
    "'matplotlib.pyplot' in sys.modules",   # no chart imported pyplot
    "display(fig)\nlen(outs)",               # display() where the chart is not the last line
    "%matplotlib inline\nfig",              # matplotlib's own formatter: still one image
]
KERNEL_SCRIPT = r"""
import json, sys
import nbformat
from nbclient import NotebookClient
nb = nbformat.v4.new_notebook()
nb.cells = [nbformat.v4.new_code_cell(c) for c in json.loads(sys.argv[1])]
NotebookClient(nb, timeout=120, kernel_name="python3").execute(cwd=sys.argv[2])
print(json.dumps([[{"mimes": sorted(o.get("data", {})), "text": o.get("data", {}).get("text/plain")}
                   for o in c.outputs] for c in nb.cells]))
"""


@pytest.fixture(scope="module", autouse=True)
def kernel_run(request):
    """The background kernel run (a Popen), if the kernel test is selected and nbclient is here."""
    wanted = any(item.name == KERNEL_TEST for item in request.session.items)
    try:
        import nbclient  # noqa: F401
    except ImportError:
        wanted = False
    if not wanted:
        yield None
        return
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-c", KERNEL_SCRIPT, json.dumps(KERNEL_CELLS), str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


@pytest.mark.parametrize("name,call", charts(), ids=[n for n, _ in charts()])
def test_every_public_chart_returns_a_figure(name, call):
    out = call()
    if name == "styled_claims":
        assert "<table" in out.to_html()
    else:
        assert isinstance(out, Figure) and out.axes


def test_a_chart_gives_jupyter_a_png():
    fig = plots.scaler_trace_chart([1, 2, 3], [4.0, 2.0, 4.0])
    assert fig._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n"


def test_all_lists_every_public_chart():
    assert sorted(plots.__all__) == sorted(n for n, _ in charts())


@pytest.mark.parametrize("call", [
    lambda: plots.comparison_chart(compare_table().iloc[:0]),
    lambda: plots.dashboard_chart(history().iloc[:0]),
    lambda: plots.adoption_chart(story().iloc[:0]),
    lambda: plots.pareto_chart(policy_table().iloc[:0]),
    lambda: plots.budget_chart([]),
    lambda: plots.race_chart(NS(table=race().table.iloc[:0])),
    lambda: plots.memory_breakdown_chart(compare_table().iloc[:0]),
    lambda: plots.memory_growth_chart(growth().iloc[:0]),
    lambda: plots.scale_chart(memory_model.scale_sweep().iloc[:0]),
    lambda: plots.scale_chart(memory_model.scale_table()),   # not a sweep over micro-batches
    lambda: plots.adoption_chart(story().drop(columns="vs")),
    lambda: plots.routes_chart(lora.routes()[["route", "peak", "fits"]]),
    lambda: plots.saved_tensors_chart({}),
    lambda: plots.memory_timeline_chart({}),
    lambda: plots.sharding_chart(sharding_table().iloc[:0], SHARDED),
    lambda: plots.loss_curves_chart({}),
    lambda: plots.styled_claims(pd.DataFrame(columns=["says", "status", "evidence", "where"])),
])
def test_empty_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_size_profile_is_stated_once_in_the_title():
    assert figure("ladder")._suptitle.get_text() == "the ladder, size 'cpu'"
    assert "size 'smoke'" in figure("pareto").axes[0].get_title()
    fig = plots.memory_breakdown_chart(compare_table(), title="one step, size 'cpu'", size="cpu")
    assert fig.axes[0].get_title().count("size 'cpu'") == 1
    assert plots.memory_breakdown_chart(compare_table()).axes[0].get_title() == \
        "where the bytes of a training step are"  # callers without it


@pytest.mark.parametrize("name", ["ladder", "measure", "dashboard"])
def test_legends_cover_no_bar(name):
    """Lesson 03's ladder and lesson 01's measure chart (comparison_chart), the dashboard."""
    _assert_legends_clear(figure(name))


def test_time_ratio_is_printed_only_outside_the_noise():
    texts = [t.get_text() for t in figure("ladder").axes[0].texts]
    assert any("within noise" in t for t in texts)  # bf16+selective: 1.02x, inside the noise
    assert not any("1.02x" in t for t in texts)
    assert sum("not drawn" in t for t in texts) == 2  # an emulated time: no bar, no ratio
    assert not any(RATIO.search(t) for t in texts)
    assert len(_bars(figure("ladder").axes[0])) == len(figure("ladder").axes[0].get_xticks()) - 2
    assert "Not drawn on the time axis" in figure("ladder").legends[-1].get_title().get_text()

    texts = _texts(figure("pareto"))
    assert "fp32 + checkpointing every 2 blocks: ≈1x (within noise)" in texts
    assert "fp32 + full checkpointing: 1.26x slower" in texts
    assert "fp32 + selective checkpointing: too small to time" in texts
    assert not any("1.69x" in t for t in texts)

    texts = [t.get_text() for t in figure("dashboard").axes[0].texts]
    assert any("within noise" in t for t in texts) and not any("1.03x" in t for t in texts)
    assert any("1.31x" in t and "slower" in t for t in texts)
    assert any("not drawn" in t for t in texts) and not any("3.80x" in t for t in texts)

    texts = [t.get_text() for t in plots.adoption_chart(story()).axes[0].texts]
    assert any("within noise" in t for t in texts) and not any("1.03x" in t for t in texts)


def test_every_printed_time_ratio_says_what_the_noise_allows():
    """A ratio never stands alone: "(faster)", "(slower)", or "(noise unknown)" in old tables."""
    for fig in (figure("ladder"), figure("measure"), figure("pareto"), figure("dashboard"),
                plots.pareto_chart(compare_table(noise=False)),
                plots.dashboard_chart(history().drop(columns=["time_verdict", "emulated"]))):
        for text in (t.get_text() for t in fig.axes[0].texts):
            if RATIO.search(text):
                assert re.search(r"faster|slower|noise unknown", text), text


def test_spread_is_drawn_as_error_bars_and_the_title_names_only_the_subject():
    ax = figure("ladder").axes[0]
    assert ax.get_title() == "step time"   # issue 24: no title about the method
    assert any(c.has_yerr for c in ax.containers if hasattr(c, "has_yerr"))


def test_a_time_bar_and_its_whisker_say_what_its_label_says():
    """The audit's AVX2 ladder: fp32 164 ms, full checkpointing 168 ms, but a per-round ratio
    of 1.16x (band 1.03-1.16x, "slower"). The bar stood at 168 ms with a whisker reaching down
    over the 164 ms reference, which looked "within noise". Now it stands at 164 x 1.16 and
    its whisker at 164 x (1.03, 1.16), clear of the reference; a row within noise reaches it."""
    df = pd.DataFrame({"label": ["fp32", "fp32+full", "fp32+selective"],
                       "step_time_s": [0.164, 0.168, 0.170], "step_time_iqr_s": [0.002] * 3,
                       "time_ratio": [1.0, 1.16, 1.02], "time_ratio_low": [1.0, 1.03, 0.97],
                       "time_ratio_high": [1.0, 1.16, 1.08],
                       "time_verdict": ["reference", "slower", "within noise"],
                       "emulated": [False] * 3, "peak_allocated": [109 * MiB, 70 * MiB, 80 * MiB],
                       "est_peak_allocated": [109 * MiB, 70 * MiB, 80 * MiB],
                       "activations": [60 * MiB, 4 * MiB, 20 * MiB],
                       "autocast_weight_copies": [0.0] * 3, "logits": [3 * MiB] * 3,
                       "est_saved_total": [63 * MiB, 7 * MiB, 23 * MiB]})
    ax = plots.comparison_chart(df).axes[0]
    assert [round(b.get_height(), 2) for b in _bars(ax)] == [164.0, 190.24, 167.28]
    (_, _), (lo, hi), (lo_s, hi_s) = _whiskers(ax)
    assert (lo, hi) == (pytest.approx(164 * 1.03), pytest.approx(164 * 1.16))
    assert lo > 164 and lo_s < 164 < hi_s
    texts = [t.get_text() for t in ax.texts]
    assert "1.16x slower" in texts and any("within noise" in t for t in texts)

    story = adoption_story(measured_table([
        ("fp32", "fp32", [1.0, 1.0, 1.0, 1.0, 1.0], 1000, False),
        ("fp32+full", "fp32", [1.3, 1.35, 1.25, 1.3, 1.3], 600, False)]),
        [("fp32", "fp32"), ("+ full", "fp32+full")])
    ax = plots.adoption_chart(story.assign(step_time_s=[1.0, 1.1])).axes[0]  # own median 1.1 s
    assert [round(b.get_height()) for b in _bars(ax)] == [1000, 1300]        # 1.0 s x 1.30
    (_, _), (lo, hi) = _whiskers(ax)
    assert lo > 1000 and lo <= 1300 <= hi


def _legend_text(fig) -> str:
    return " ".join(t.get_text() for leg in fig.legends for t in leg.get_texts())


def test_pareto_draws_the_bars_its_legend_names():
    """The bars are named in the legend; the axis names its subject alone ("step time (ms)",
    no words about the method)."""
    fig = figure("pareto")
    assert "interquartile" in _legend_text(fig) and fig.axes[0].collections  # errorbars
    assert fig.axes[0].get_xlabel() == "step time (ms)"
    fig = plots.pareto_chart(policy_table().assign(step_time_iqr_s=None))
    assert "interquartile" not in _legend_text(fig) and "no spread" in _legend_text(fig)
    assert not fig.axes[0].collections
    spread = policy_table().assign(time_ratio_low=lambda d: d.time_ratio * 0.9,
                                   time_ratio_high=lambda d: d.time_ratio * 1.1)
    fig = plots.pareto_chart(spread)
    assert "spread" in _legend_text(fig) and fig.axes[0].collections
    # the front's definition, as the chart draws it: ties in time count as equal
    assert "no other policy is smaller at a step time as short" in _legend_text(fig)


def test_pareto_point_labels_do_not_overlap():
    fig = figure("pareto")
    r = _layout(fig)
    boxes = [t.get_window_extent(r) for t in fig.axes[0].texts]
    assert len(boxes) == 5
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not _overlap(a, b)


def test_growth_chart_names_every_series_of_both_panels():
    fig = figure("growth")
    assert len(fig.axes) == 2
    for ax in fig.axes:  # the right panel too: its own legend or the figure's
        legends = list(fig.legends) + ([ax.get_legend()] if ax.get_legend() else [])
        shown = {t.get_text() for leg in legends for t in leg.get_texts()}
        for line in ax.lines:
            assert line.get_label() in shown, f"{line.get_label()!r} unnamed in {ax.get_title()!r}"
    for ax in fig.axes:  # a measurement equal to its estimate: the line on top dashed, markers open
        est = [ln for ln in ax.lines if "estimate" in ln.get_label()]
        meas = [ln for ln in ax.lines if "measured" in ln.get_label()]
        assert est and meas and all(ln.get_linestyle() == "--" for ln in est)
        assert all(ln.get_markerfacecolor() in ("white", "none") for ln in meas)
        assert min(ln.get_zorder() for ln in est) > max(ln.get_zorder() for ln in meas)
    _assert_legends_clear(fig)


def test_scale_chart_draws_where_the_peak_leaves_the_optimizer_step():
    """One panel per model, one line per recipe over the micro-batch; the dotted line is the
    optimizer step's bytes; a filled marker is a peak there, an open one a peak in backward;
    GPU lines only where they are not lost on the axis (the 70B panel shows none)."""
    sweep = memory_model.scale_sweep(batch_sizes=(1, 2, 4, 8, 16, 32))
    fig = plots.scale_chart(sweep, gpus={"24 GiB GPU": 24, "80 GiB GPU": 80})
    assert [ax.get_title() for ax in fig.axes] == [
        f"{m} ({memory_model.SCALE_MODELS[m].n_parameters / 1e9:.2f}B parameters)"
        for m in memory_model.SCALE_MODELS]
    ax7 = fig.axes[1]
    sub = sweep[sweep["model"] == "7B"]
    floor = sub["optimizer step GiB"].iloc[0]
    assert [ln.get_ydata()[0] for ln in ax7.lines if ln.get_linestyle() == ":"] == [pytest.approx(floor)]
    recipes = [ln for ln in ax7.lines if ln.get_linestyle() == "-"]
    assert [ln.get_label() for ln in recipes] == list(memory_model.SCALE_RECIPES)
    for ln, (_, r) in zip(recipes, sub.groupby("recipe", sort=False)):
        assert list(ln.get_ydata()) == pytest.approx(list(r["peak GiB"]))
    at_step = (sub["peak at"] == "optimizer step").sum()
    filled = sum(len(c.get_offsets()) for c in ax7.collections
                 if c.get_facecolor().size and tuple(c.get_facecolor()[0][:3]) != (1.0, 1.0, 1.0))
    assert filled == at_step and 0 < at_step < len(sub)   # at one sequence the optimizer step, not beyond
    assert [t.get_text() for t in fig.axes[2].texts] == []  # 24 and 80 GiB vanish beside 1,300 GiB
    assert {t.get_text() for t in ax7.texts} == {"24 GiB GPU", "80 GiB GPU"}
    _assert_legends_clear(fig)


def test_no_pyplot_and_one_inline_image_in_a_kernel(kernel_run):
    """In a fresh kernel: every chart without pyplot; a chart as a cell's last expression shows
    one PNG (a plain Figure shows as "<Figure size ...>" text alone); after ``;`` nothing;
    ``display(fig)`` one PNG; after ``%matplotlib inline`` still exactly one (nothing twice)."""
    if kernel_run is None:
        pytest.skip("nbclient is not installed")
    out, err = kernel_run.communicate(timeout=300)
    assert kernel_run.returncode == 0, err[-3000:]
    cells = json.loads(out.strip().splitlines()[-1])
    assert [o["mimes"] for o in cells[1]] == [["image/png", "text/plain"]]
    assert cells[2] == []
    assert cells[3][0]["text"] == "False", "a chart imported matplotlib.pyplot"
    assert [o["mimes"] for o in cells[4]] == [["image/png", "text/plain"], ["text/plain"]]
    assert [o["mimes"] for o in cells[5]] == [["image/png", "text/plain"]]


def test_pareto_front_treats_times_within_the_noise_as_ties():
    """b is 2 % slower than a but within the noise: a tie in time, so b's smaller peak puts it on
    the front and a, no smaller, is dominated; c is faster outside the noise and stays."""
    table = pd.DataFrame({
        "label": ["a", "b", "c"], "step_time_s": [1.0, 1.02, 0.7],
        "step_time_iqr_s": [0.05, 0.05, 0.01], "peak_allocated": [100 * MiB, 60 * MiB, 120 * MiB],
        "time_ratio": [1.0, 1.02, 0.7], "time_ratio_low": [0.97, 0.98, 0.68],
        "time_ratio_high": [1.03, 1.06, 0.72],
        "time_verdict": ["reference", "within noise", "faster"], "emulated": [False] * 3})
    ax = plots.pareto_chart(table).axes[0]
    front = [line for line in ax.lines if line.get_label() == "Pareto front"][0]
    assert list(front.get_xdata()) == [700.0, 1020.0]   # a (1000 ms, 100 MiB) is out: b ties it


def test_lesson03_charts_draw_what_they_are_given(fp32_search):
    """The charts of lesson 03 (course_utils.plots): real inputs in, the right panels out."""
    from course_utils import plots
    from course_utils.claims import Verdict, claims_table

    budget, s = fp32_search
    fig = plots.budget_chart([s])
    (ax,) = fig.axes                    # memory only: the search's single steps are not a throughput
    assert [line.get_ydata()[0] for line in ax.lines if line.get_color() == "#B71C1C"] == \
        [pytest.approx(budget / MiB)]
    assert len(ax.collections) == len([p for p in s.probes if p.peak_allocated is not None])
    with pytest.raises(ValueError):
        plots.budget_chart([])

    fig = plots.scale_chart(memory_model.scale_sweep(batch_sizes=(1, 4)), gpus={"24 GiB": 24})
    assert len(fig.axes) == len(memory_model.SCALE_MODELS)
    assert fig.axes[0].get_ylim()[1] > 24  # the 1B panel reaches the 24 GiB line

    story = pd.DataFrame({"step": ["a", "b", "c"], "step_time_s": [0.2, 0.1, float("nan")],
                          "peak_allocated": [100 * MiB, 80 * MiB, 40 * MiB],
                          "source": ["measured", "measured", "estimate"], "vs": [None, "a", "b"],
                          "peak_ratio": [float("nan"), 0.8, 0.5]})
    fig = plots.adoption_chart(story)
    texts = [t.get_text() for t in fig.axes[1].texts]
    assert "0.80x\nvs a" in texts and "0.50x\nvs b\n(estimate)" in texts

    ledger = claims_table([Verdict("C2", "busted", "peak 0.8x <fp32>", "[03 §1](#1.-The-ladder)"),
                           Verdict("C1", "not measured here", "no GPU", "01")])
    html = plots.styled_claims(ledger).to_html()
    assert '<a href="#1.-The-ladder">03 §1</a>' in html
    assert "&lt;fp32&gt;" in html  # evidence text is escaped, links are not
    assert "#FFCDD2" in html  # failed red


def _axes(fig):
    return [ax for ax in fig.axes if ax.get_visible()]


def test_format_range_chart_one_bar_pair_per_format():
    fig = plots.format_range_chart(format_table())
    ax = _axes(fig)[0]
    assert len(ax.patches) == 2 * len(FORMATS)
    assert [t.get_text() for t in ax.get_yticklabels()] == list(FORMATS)[::-1]
    with pytest.raises(ValueError):
        plots.format_range_chart(pd.DataFrame({"max": [1.0]}))


def test_log2_histogram_chart_panels_and_errors():
    h = {"g": log2_histogram(torch.tensor([1e-9, 1e-5, 1e-3]))}
    fig = plots.log2_histogram_chart(h, "fp16", scale=2.0 ** 16)
    assert len(_axes(fig)) == 1
    two = plots.log2_histogram_chart({"a": h["g"], "b": h["g"]})
    assert len(_axes(two)) == 2
    with pytest.raises(ValueError):
        plots.log2_histogram_chart({})
    with pytest.raises(ValueError):
        plots.log2_histogram_chart(h, scale=-1.0)


def test_scaler_trace_chart_accepts_series_and_checks_lengths():
    steps = pd.Series([1, 2, 3])
    fig = plots.scaler_trace_chart(steps, [4.0, 2.0, 2.0], skipped=steps[steps == 2],
                                   injected=[2])
    assert _axes(fig)[0].get_yscale() == "log"
    with pytest.raises(ValueError):
        plots.scaler_trace_chart([1, 2], [1.0])


def test_memory_breakdown_and_loss_charts():
    row = {"label": "fp32", "peak_allocated": 100 * 2**20}
    for k in ("parameters", "gradients", "optimizer_state", "activations",
              "autocast_weight_copies", "logits"):
        row[k] = row["est_" + k] = 10 * 2**20
    fig = plots.memory_breakdown_chart(pd.DataFrame([row, dict(row, label="bf16")]))
    assert len(_axes(fig)[0].patches) == 2 * 2 * 6     # 2 configs x (measured, estimate) x 6 parts
    with pytest.raises(ValueError):
        plots.memory_breakdown_chart(pd.DataFrame())
    fig = plots.loss_curves_chart({"a": ([0, 10, 20], [5.0, 3.0, 2.5])})
    assert len(_axes(fig)) == 2
    with pytest.raises(ValueError):
        plots.loss_curves_chart({"a": ([0, 1], [5.0])})
    with pytest.raises(ValueError):
        plots.loss_curves_chart({})


def test_loss_curves_chart_with_the_flushed_share():
    hs = {"fp32": arm_history("fp32", [5.0, 4.0], [0, 0]),
          "fp16, no scaler": arm_history("fp16, no scaler", [5.0, 4.5], [0.2, 0.4])}
    fig = plots.loss_curves_chart(hs, title="(B) test", size="smoke", flushed=True)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 2
    assert "size 'smoke'" in fig.get_suptitle()
    assert "flushed" in axes[1].get_title()
    flushed_line = axes[1].get_lines()[1]
    assert list(flushed_line.get_ydata()) == [20.0, 40.0]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "fp16, no scaler: 4.500, flushed 30%" in labels
    # without flushed=True: the zoom on the second half, as before
    zoom = plots.loss_curves_chart(hs)
    assert "zoom" in [ax for ax in zoom.axes if ax.get_visible()][1].get_title()
    with pytest.raises(ValueError, match="flushed"):
        plots.loss_curves_chart({"x": arm_history("x", [1.0], [])}, flushed=True)
    with pytest.raises(ValueError, match="flushed"):
        plots.loss_curves_chart({"x": ([0, 1], [2.0, 1.0])}, flushed=True)




def test_lesson_charts_draw_and_reject_bad_input(cfg, block):
    x = x_like(cfg)
    plain = saved_by_module(block, lambda: block(x))
    ckpt = saved_by_module(block, lambda: checkpoint(block, x, use_reentrant=False))
    fig = plots.saved_tensors_chart({"plain": plain, "checkpoint": ckpt})
    assert len(fig.axes) == 1 and len(fig.axes[0].patches) == plain.module.nunique() * 2 + 2
    with pytest.raises(ValueError):
        plots.saved_tensors_chart({})

    growth = pd.DataFrame([dict(sweep=s, batch_size=b, seq_len=t, saved=b * t, est_saved=b * t,
                                static=float("nan"), est_static=100.0)
                           for s, b, t in (("batch_size", 1, 8), ("batch_size", 2, 8),
                                           ("seq_len", 1, 8), ("seq_len", 1, 16))])
    assert len(plots.memory_growth_chart(growth).axes) == 2
    with pytest.raises(ValueError):
        plots.memory_growth_chart(growth.drop(columns="est_static"))

    seg = pd.DataFrame([dict(method=m, segments=s, saved_bytes=s * MiB, peak_bytes=(s + 8 / s) * MiB,
                             est_saved=s * MiB, est_peak=(s + 8 / s) * MiB)
                        for m in ("loop", "checkpoint_sequential") for s in (1, 2, 4, 8)])
    fig = plots.segments_chart(seg, n_layers=8)
    assert len(fig.axes) == 2
    # equal peaks of two methods stay visible: a thin line with small markers over a thick one
    thick, thin = [line for line in fig.axes[1].lines if "(measured)" in line.get_label()]
    assert thick.get_linewidth() > 2 * thin.get_linewidth()
    assert thick.get_markersize() > 2 * thin.get_markersize() and thin.get_zorder() > thick.get_zorder()
    assert fig.legends and "loop (model)" in [t.get_text() for t in fig.legends[0].get_texts()]
    with pytest.raises(ValueError):
        plots.segments_chart(seg.iloc[:0], n_layers=8)

    table = pd.DataFrame({"label": ["a", "b", "c"], "step_time_s": [1.0, 1.2, 2.0],
                          "step_time_iqr_s": [0.1, 0.1, None],
                          "peak_allocated": [100 * MiB, 50 * MiB, 80 * MiB]})
    ax = plots.pareto_chart(table).axes[0]
    from matplotlib.colors import same_color
    front = sorted({float(v) for line in ax.lines if same_color(line.get_color(), "#DD8452")
                    for v in line.get_xdata()})
    assert front == [1000.0, 1200.0]  # the front joins a and b; c is dominated by b
    with pytest.raises(ValueError):
        plots.pareto_chart(table.assign(step_time_s=None))

    att = pd.DataFrame([dict(attention=a, seq_len=t, saved_bytes=t * (t if a == "naive" else 1))
                        for a in ("naive", "sdpa") for t in (8, 16, 32)])
    labels = [line.get_label() for line in plots.attention_memory_chart(att).axes[0].lines]
    assert any("slope 2.00" in label for label in labels)
    assert any("slope 1.00" in label for label in labels)
    # an estimate equal to its measurement is drawn over it, not hidden under it
    lines = {line.get_label(): line for line in
             plots.attention_memory_chart(att.assign(est_bytes=att.saved_bytes), size="smoke").axes[0].lines}
    assert lines["naive: estimate"].get_zorder() > lines["naive: measured (slope 2.00)"].get_zorder()
    assert lines["naive: measured (slope 2.00)"].get_markerfacecolor() == "white"

    tl = memory_timeline(lambda: torch.ones(1000))
    assert len(plots.memory_timeline_chart({"a": tl, "b": tl}).axes) == 2
    # the axis is each run's share of its step: a step twice as long draws the same phases
    slow = timeline()
    slow.t_ms = [2 * t for t in slow.t_ms]
    slow.phases = [NS(name=p.name, start_ms=2 * p.start_ms, end_ms=2 * p.end_ms) for p in slow.phases]
    for fig in (plots.memory_timeline_chart({"t": timeline()}),
                plots.memory_timeline_chart({"t": slow})):
        ax = fig.axes[0]
        assert ax.get_xlim() == (0, 100)
        spans = sorted(round(float(patch.get_x() if hasattr(patch, "get_x")   # matplotlib >= 3.9
                                   else patch.get_xy()[:, 0].min()), 6)       # older: a Polygon
                       for patch in ax.patches)                               # the phases' starts
        assert spans == [0.0, 40.0, 90.0]
    with pytest.raises(ValueError):
        plots.memory_timeline_chart({})


def test_adoption_story_skips_an_emulated_step_as_reference():
    df = measured_table([("fp32", "fp32", [1.0, 1.02, 0.98, 1.0, 1.0], 1000, False),
                 ("bf16", "bf16", [3.0], 800, True),
                 ("fp32+full", "fp32", [1.3, 1.32, 1.28, 1.3, 1.3], 600, False)])
    story = adoption_story(df, [("fp32", "fp32"), ("+ bf16", "bf16"), ("+ compile", None),
                                ("+ full", "fp32+full")], estimates=[("+ shard", 300)])
    assert list(story["step"]) == ["fp32", "+ bf16", "+ full", "+ shard"]   # nothing unmeasured
    assert list(story["source"]) == ["measured", "measured", "measured", "estimate"]
    assert list(story["adopted"]) == [True, False, True, True]
    assert pd.isna(story["vs"][0]) and list(story["vs"][1:]) == ["fp32", "fp32", "+ full"]  # not bf16
    assert story["time_verdict"].tolist()[:2] == ["reference", "emulated"]
    assert story.loc[2, "time_verdict"] == "slower" and story.loc[2, "time_ratio"] == pytest.approx(1.3)
    fig = plots.adoption_chart(story, size="cpu")
    mem = [t.get_text() for t in fig.axes[1].texts]
    # every ratio names the bar it is a ratio to: the 0.60x beside "+ bf16" is to fp32
    assert mem == ["0.80x\nvs fp32", "0.60x\nvs fp32", "0.50x\nvs full\n(estimate)"]
    times = [t.get_text() for t in fig.axes[0].texts]
    assert "1.30x slower\nvs fp32" in times and "emulated:\nnot drawn" in times
    assert times.count("not timed") == 1          # the estimate's slot says why it has no bar
    assert "+ bf16 (emulated here)" in fig._supxlabel.get_text() and "ms" not in fig._supxlabel.get_text()
    with pytest.raises(ValueError, match="no row"):
        adoption_story(df, [("x", "nope")])


def test_adoption_story_reads_a_step_from_its_own_comparison():
    """torch.compile is timed in its own comparison against the eager recipe (lesson 03 §3): its
    ratio is to that row, named "+ bf16", and full checkpointing, measured without compile,
    stays against "+ bf16" too."""
    df = measured_table([("fp32", "fp32", [1.0] * 5, 1000, False),
                         ("bf16", "bf16", [0.5] * 5, 800, False),
                         ("bf16+full", "bf16", [0.6] * 5, 500, False)])
    cdf = measured_table([("bf16", "bf16", [0.52] * 5, 800, False),
                          ("bf16+compile", "bf16", [0.4] * 5, 780, False)])
    story = adoption_story(df, [("fp32", "fp32"), ("+ bf16", "bf16"),
                                ("+ compile", "bf16+compile", cdf), ("+ full", "bf16+full")])
    assert pd.isna(story["vs"][0]) and list(story["vs"][1:]) == ["fp32", "+ bf16", "+ bf16"]
    assert story.loc[2, "time_ratio"] == pytest.approx(0.4 / 0.52)
    assert story.loc[3, "time_ratio"] == pytest.approx(1.2)
    assert story.loc[2, "peak_ratio"] == pytest.approx(780 / 800)
    texts = [t.get_text() for t in plots.adoption_chart(story).axes[0].texts]
    assert "1.30x faster\nvs bf16" in texts and "1.20x slower\nvs bf16" in texts


def test_routes_chart_marks_what_fits():
    routes = lora.routes()
    fig = plots.routes_chart(routes, gpu_gib=24, title="7B", size="cpu")
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert sum("does not fit" in t for t in texts) == 2 and sum(t.endswith(": fits") for t in texts) == 2
    assert "24 GiB GPU" in texts
    assert [line.get_xdata()[0] for line in ax.lines] == [24]
    assert fig._suptitle.get_text() == "7B, size 'cpu'"
    with pytest.raises(ValueError):
        plots.routes_chart(routes.iloc[:0])
    with pytest.raises(ValueError, match="gpu_gib"):
        plots.routes_chart(routes, gpu_gib=0)
    assert np.isfinite(ax.get_xlim()[1])


def test_the_pareto_chart_labels_policies_in_words():
    """Lesson 02's chart read 'bf16+segments:2: 1.19x slower' and 'bf16: reference' under a
    markdown that speaks of `none`: the points are labelled as the tables label them."""
    table = policy_table().assign(checkpoint=["none", "full", "every-2", "segments:2", "selective"])
    texts = [t.get_text() for t in plots.pareto_chart(table).axes[0].texts]
    assert any(t.startswith("fp32 (no checkpointing)") for t in texts), texts
    assert any(t.startswith("fp32 + 2 checkpointed segments") for t in texts), texts
    assert any(t.startswith("fp32 + checkpointing every 2 blocks") for t in texts), texts
    assert not any("+segments:" in t or "+every-" in t for t in texts), texts


def test_the_budget_chart_draws_no_throughput_the_search_did_not_time():
    """The search times one step per batch, not in alternation: its chart draws memory only,
    and names the configurations in words."""
    fig = plots.budget_chart(searches())
    assert len(fig.axes) == 1
    axis_words = " ".join(ax.get_ylabel() + ax.get_xlabel() + ax.get_title() for ax in fig.axes)
    assert "tokens" not in axis_words
    names = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert "bf16 + full checkpointing: largest batch 14" in names
    assert not any("bf16+full" in n for n in names)


def test_the_race_chart_prints_a_per_token_ratio_only_outside_the_noise():
    """Per token, full checkpointing at batch 8 is 2.17 x 3/8 = 0.81 of bf16's time (band
    0.76-0.87: 1.23x faster); selective at batch 5 is 1.68 x 3/5 = 1.01 (band 0.93-1.08:
    within noise, so no number)."""
    fig = plots.race_chart(race(), size="cpu")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == ["reference", "1.23x faster\nvs bf16", "≈1x\n(within noise)\nvs bf16"]
    # each bar is the first's tokens/s / its per-token ratio (6316 / 0.814, 6316 / 1.008), not
    # its own median: the bar says what its label says
    assert [round(b.get_height()) for b in _bars(fig.axes[0])] == [6316, 7762, 6266]
    assert any(c.has_yerr for c in fig.axes[0].containers if hasattr(c, "has_yerr"))
    (_, _), (lo_full, hi_full), (lo_sel, hi_sel) = _whiskers(fig.axes[0])
    assert lo_full > 6316                       # "1.23x faster": the band stays above the reference
    assert lo_sel < 6316 < hi_sel               # "within noise": the band reaches the reference
    assert lo_sel == pytest.approx(6316 / (1.80 * 3 / 5), rel=1e-3)   # reference / high
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks[1].replace("\n", " ") == "bf16 + full checkpointing micro-batch 8"


def lesson02_bf16_table() -> pd.DataFrame:
    """Lesson 02's five policies as the AMX CPU measured them (the audit's D3): every-2 at
    90.6 ms / 69.1 MiB sits just left of and below segments:2 at 100 ms / 71.1 MiB."""
    ref = 0.0828
    ratio = [1.0, 1.204, 1.094, 1.208, 1.232]
    return pd.DataFrame({
        "label": ["bf16", "bf16+full", "bf16+every-2", "bf16+segments:2", "bf16+selective"],
        "checkpoint": ["none", "full", "every-2", "segments:2", "selective"],
        "step_time_s": [ref, 0.0997, 0.0900, 0.1015, 0.1019],  # own medians: not the ratios'
        "paired_step_time_s": [ref * r for r in ratio],
        "step_time_iqr_s": [0.002] * 5, "time_ratio": ratio,
        "time_ratio_low": [0.97, 1.16, 1.06, 1.17, 1.19],
        "time_ratio_high": [1.03, 1.22, 1.12, 1.25, 1.27],
        "time_verdict": ["reference", "slower", "slower", "slower", "slower"],
        "emulated": [False] * 5,
        "peak_allocated": [v * MiB for v in (86.1, 63.5, 69.1, 71.1, 73.2)]})


def test_pareto_labels_sit_on_their_own_points():
    """On the AMX CPU the label "2 checkpointed segments: 1.21x slower" sat under the every-2
    point, across its error bar, and every-2's label ran across the segments point: read
    naturally, each named the other's point. Each label is anchored on its own point (at the
    step time the table prints: the reference's median times the ratio), covers no other
    point's marker or error bar, is nearer its own point than any other, and a label placed
    away from its point has a leader line to it."""
    table = lesson02_bf16_table()
    fig = plots.pareto_chart(table)
    ax = fig.axes[0]
    r = _layout(fig)
    texts = ax.texts
    assert len(texts) == 5
    x = 1e3 * table["paired_step_time_s"].to_numpy()
    y = table["peak_allocated"].to_numpy() / MiB
    for i, t in enumerate(texts):
        assert t.get_text().startswith(plain_label(table["label"][i]))
        assert np.allclose(t.xy, (x[i], y[i]))   # the anchor is its own point
    pts = ax.transData.transform(np.c_[x, y])
    half = 3.5 * r.points_to_pixels(1.0)          # the markers: 7 points across
    bars = [seg for c in ax.collections for seg in c.get_segments()]
    bar_px = [ax.transData.transform(s) for s in bars if len(s) == 2 and s[0][1] == s[1][1]]
    assert len(bar_px) == 5                          # one horizontal error bar a point

    def dist(box, p):
        return np.hypot(max(box.x0 - p[0], 0, p[0] - box.x1), max(box.y0 - p[1], 0, p[1] - box.y1))
    leaders = [ln for ln in ax.lines if ln.get_label() == "_leader line"]
    for i, t in enumerate(texts):
        box = t.get_window_extent(r)
        for j, p in enumerate(pts):
            if j == i:
                continue
            marker = Bbox([[p[0] - half, p[1] - half], [p[0] + half, p[1] + half]])
            assert not _overlap(box, marker), (t.get_text(), "covers the point of", texts[j].get_text())
            (a, yb), (b, _) = sorted(bar_px[j], key=lambda q: q[0])
            assert not _overlap(box, Bbox([[a, yb - 1], [b, yb + 1]])), (
                t.get_text(), "crosses the error bar of", texts[j].get_text())
        ends = [ax.transData.transform(np.c_[ln.get_xdata(), ln.get_ydata()]) for ln in leaders]
        led = any(np.hypot(*(e[0] - pts[i])) < 2 * half and dist(box, e[1]) < 2 for e in ends)
        if dist(box, pts[i]) > 14 * r.points_to_pixels(1.0):  # away from its point: a leader
            assert led, t.get_text()
        if not led:  # beside its point: nearer it than any other
            for j, p in enumerate(pts):
                assert j == i or dist(box, pts[i]) < dist(box, p), (
                    t.get_text(), "nearer the point of", texts[j].get_text())
    assert len(leaders) <= 2   # most labels sit beside their points


def test_pareto_front_reads_ties_from_the_rows_own_rounds():
    """Lesson 02 (2 loaded cores): selective at 1.08x and every-2 at 1.27x of none, their bands
    against none overlapping, so the chart called them tied and left selective (faster, a little
    larger) off the front. Timed in the same rounds, every-2 is slower than selective in every
    round: not a tie, and selective is on the front."""
    from types import SimpleNamespace
    ref = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    sel = [1.08, 1.02, 1.12, 1.06, 1.09, 1.10, 1.07, 1.05, 1.11]
    ev2 = [1.20, 1.45, 1.15, 1.30, 1.27, 1.60, 1.18, 1.35, 1.25]
    table = pd.DataFrame({
        "label": ["none", "sel", "ev2"], "step_time_s": [1.0, 1.08, 1.27],
        "step_time_iqr_s": [0.01, 0.03, 0.1], "peak_allocated": [86 * MiB, 73 * MiB, 69 * MiB],
        "time_ratio": [1.0, 1.08, 1.27], "time_ratio_low": [1.0, 1.05, 1.14],
        "time_ratio_high": [1.0, 1.16, 1.52],
        "time_verdict": ["reference", "slower", "slower"], "emulated": [False] * 3})

    def front(df):  # the peaks (MiB) of the points on the front, fastest first
        ax = plots.pareto_chart(df).axes[0]
        line = [ln for ln in ax.lines if ln.get_label() == "Pareto front"][0]
        return [round(v) for v in line.get_ydata()]

    assert front(table) == [86, 69]                   # bands overlap: sel "tied" with ev2, dropped
    table.attrs["measurements"] = [SimpleNamespace(step_times_s=t) for t in (ref, sel, ev2)]
    table.attrs["size"] = "cpu"
    assert front(table) == [86, 73, 69]               # its own rounds: ev2 slower than sel
    tied = [SimpleNamespace(step_times_s=t) for t in (ref, sel, [v * 1.08 / 1.27 for v in ev2])]
    table = table.assign(step_time_s=[1.0, 1.08, 1.08])
    table.attrs.update(measurements=tied, size="cpu")
    assert front(table) == [86, 69]                   # truly tied: the smaller one dominates


def test_a_korean_kernel_gets_the_charts_in_korean(monkeypatch):
    """Issue 28: under COURSE_LANG=ko the charts' titles, axes, legends and bar notes are Korean
    (configuration names, numbers and units stay); a verdict stays an English constant in the
    data and is shown as its Korean word; every text a chart looks up by value (default titles,
    verdicts, claim statuses, the parts of a peak, the phases of a step) has its Korean."""
    import inspect

    from course_utils import claims, i18n, memory_model, step_timing
    from course_utils.plots._timing import time_note
    monkeypatch.setenv("COURSE_LANG", "ko")
    fig = plots.comparison_chart(compare_table(), size="cpu")
    ax_t, ax_p = fig.axes[:2]
    assert ax_p.get_title() == "최대 할당 메모리" and ax_t.get_ylabel() == "스텝 시간(ms)"
    assert fig.get_suptitle() == "크기 'cpu'"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "저장됨: autocast 가중치 사본" in legend and "추정치" in legend
    note = time_note(1.3, "slower", low=1.2, high=1.4)
    assert (note.text, note.verdict) == ("1.30x 더 느림", "slower")
    table = pd.DataFrame({"says": ["bf16 cuts memory"], "status": ["held"],
                          "evidence": ["peak 0.81x"], "where": ["[01 §6](#6)"]})
    html = plots.styled_claims(table).to_html()
    assert ">성립<" in html and ">판정<" in html and "#C8E6C9" in html  # coloured by its status
    assert list(table["status"]) == ["held"]
    html = plots.styled_claims(table.assign(basis=["none"])).to_html()
    assert ">근거 없음<" in html and list(table.columns).count("basis") == 0  # not 'none' translated
    ko = i18n.catalog("ko")
    defaults = [p.default for name in plots.__all__
                for p in inspect.signature(getattr(plots, name)).parameters.values()
                if p.name in ("title", "ylabel") and isinstance(p.default, str) and p.default]
    looked_up = [*defaults, *step_timing.VERDICTS, *claims.STATUSES, *memory_model.PEAK_PARTS,
                 "forward", "backward", "optimizer", "says", "status", "evidence", "where"]
    assert len(defaults) >= 5 and [t for t in looked_up if t not in ko] == []
