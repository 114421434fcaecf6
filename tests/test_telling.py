"""Tests of the telling: the words a learner reads agree with the numbers beside them.

Each rule is a checker function, run on what the course prints (the library's sentences and
tables, lesson cells executed here) *and* on a deliberately broken sentence, table or chart,
which it must reject: a checker that accepted the broken case could not fail.

1. a lesson's verdict and the claims ledger's agree for the same evidence (the checker here;
   the ledger's tests are in test_claims.py);
2. a printed "faster"/"slower" never sits inside its printed interval;
3. the "peak falls at" sentence names the estimate's own moment;
4. a default table has at most 7 columns (index included) and no raw byte counts;
5. no emulated time is drawn on a time axis;
6. machinery words are at most 5 % of a lesson's markdown outside its "How this lesson
   measures" box (the checker here; test_notebooks.py applies it to every lesson).
"""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import matplotlib
import nbformat
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from nbcells import cell

from course_utils import claims, memory_model, plots
from course_utils.experiments import summary
from course_utils.i18n import tr
from course_utils.step_timing import time_ratio
from course_utils.terms import GiB, MiB

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parents[1]


# --- 1. a lesson's verdict == the ledger's ---------------------------------------------------


# --- 2. faster/slower never inside the printed interval ---------------------------------------

SETTLED = re.compile(r"(\d+\.\d+)x (faster|slower)\b[^()]*\((?:noise band|IQR) (\d+\.\d+)-(\d+\.\d+)x")
OLD_FORM = re.compile(r"(\d+\.\d+)x \((?:noise band|IQR) (\d+\.\d+)-(\d+\.\d+)x[^)]*\): (faster|slower)")


def check_time_sentence(text: str) -> None:
    """A "faster"/"slower" whose printed interval contains 1.00 breaks the rule."""
    for m in SETTLED.finditer(text):
        lo, hi = float(m.group(3)), float(m.group(4))
        assert not lo <= 1.0 <= hi, f"{m.group(0)!r}: the interval contains 1.00"
    for m in OLD_FORM.finditer(text):
        lo, hi = float(m.group(2)), float(m.group(3))
        assert not lo <= 1.0 <= hi, f"{m.group(0)!r}: the interval contains 1.00"
    assert not re.search(r"0\.\d+x faster", text), f"{text!r}: a speed-up below 1x"


def test_no_settled_time_sentence_sits_inside_its_interval():
    rng = np.random.default_rng(0)
    sentences = []
    for centre in np.linspace(0.9, 1.1, 41):
        for spread in (0.005, 0.01, 0.03):
            for rounds in (3, 5, 9, 15):
                ratios = centre + spread * rng.standard_normal(rounds)
                t = time_ratio(list(ratios), [1.0] * rounds, size="cpu")
                sentences.append(t.describe("step time"))
                if t.settled:
                    sentences.append(claims.verdict("C5", full_time=t).evidence)
    for s in sentences:
        check_time_sentence(s)
    assert any("faster" in s for s in sentences) and any("slower" in s for s in sentences)
    assert any("within noise" in s for s in sentences)


@pytest.mark.parametrize("broken", [
    "step time 1.03x (IQR 1.00-1.06x over 5 rounds): slower",   # lesson 03 before issue 18
    "step time 1.03x slower (noise band 0.99-1.06x over 9 rounds)",
    "step time 0.70x faster (noise band 0.65-0.75x over 9 rounds)"])
def test_the_time_checker_rejects_a_broken_sentence(broken):
    with pytest.raises(AssertionError):
        check_time_sentence(broken)


# --- 3. "the peak falls at" names the estimate's moment ----------------------------------------

def check_peak_sentence(sentence: str, estimates) -> None:
    """Each moment named after "at " is the estimate's, and every estimate's moment is named."""
    said = sentence.split(" at ", 1)[1] if " at " in sentence else ""
    moments = {e.peak_at for e in estimates}
    named = {m.strip(" .") for m in said.split(" / ")}
    assert named == moments, f"{sentence!r} names {named}, the estimates say {moments}"


def run_cell(nb_path: Path, cell_id: str, namespace: dict) -> str:
    src = cell(nb_path, cell_id).source
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(src, f"{nb_path.name}:{cell_id}", "exec"), namespace)
    return out.getvalue()


def test_lesson03_peak_sentences_name_the_estimates_moment():
    ns = {"memory_model": memory_model, "estimate": memory_model.estimate, "GiB": GiB, "tr": tr}
    printed = run_cell(ROOT / "notebooks" / "03_combined_stack.ipynb", "scale", ns).splitlines()
    assert len(printed) == len(memory_model.SCALE_MODELS)
    for name, line in zip(memory_model.SCALE_MODELS, printed):
        ests = [memory_model.estimate(memory_model.scale_config(name, 1, *rc))
                for rc in memory_model.SCALE_RECIPES.values()]
        check_peak_sentence(line.split("estimated peak", 1)[1], ests)
    # the broken sentence lesson 03 printed before: a copied formula, drifted
    ests = [memory_model.estimate(memory_model.scale_config("7B", 1, *rc))
            for rc in memory_model.SCALE_RECIPES.values()]
    with pytest.raises(AssertionError):
        check_peak_sentence("7B: estimated peak 125.1 GiB; the peak falls at the start of backward.",
                            ests)


# --- 4. readable tables --------------------------------------------------------------------

def check_readable(df: pd.DataFrame) -> None:
    """At most 7 columns, the index included, and no raw byte counts (integers >= 10^6 in a
    column whose header names no unit)."""
    n = df.shape[1] + (df.index.nlevels if not isinstance(df.index, pd.RangeIndex) else 0)
    assert n <= 7, f"{n} columns: {list(df.columns)}"
    for col in df.columns:
        cells = df[col].map(lambda v: v.replace(",", "") if isinstance(v, str) else v)  # "23,000"
        vals = pd.to_numeric(cells, errors="coerce").dropna()
        if len(vals) and not re.search(r"/s|tokens|batch|param", str(col)):
            assert not ((vals >= 1e6) & (vals == vals.round())).any(), f"raw bytes in {col!r}"


def compare_like() -> pd.DataFrame:
    rows = []
    for label, t, peak, saved, verdict, ratio in (
            ("fp32", 0.20, 70e6, 60e6, "reference", 1.0),
            ("bf16", 0.14, 60e6, 40e6, "faster", 0.70),
            ("bf16+full", 0.17, 40e6, 5e6, "within noise", 1.01),
            ("bf16+full+accum2", 0.2, 38e6, 3e6, "slower", 1.2)):
        rows.append({"label": label, "batch_size": 8, "step_time_s": t, "time_ratio": ratio,
                     "time_ratio_low": ratio * 0.97, "time_ratio_high": ratio * 1.03,
                     "time_verdict": verdict, "tokens_per_s": 8 * 128 / t,
                     "peak_allocated": peak, "est_peak_allocated": peak * 1.01,
                     "saved_total": saved, "est_saved_total": saved, "peak_ratio": peak / 70e6,
                     "saved_ratio": saved / 60e6, "activations": saved * 0.9,
                     "autocast_weight_copies": saved * 0.1, "oom": False})
    return pd.DataFrame(rows)


def test_default_tables_are_readable():
    s = summary(compare_like())
    check_readable(s)
    assert list(s.index)[-1] == "bf16 + full checkpointing, 2 micro-batches"
    assert s.loc["bf16", "time vs first"] == "1.43x faster (1.39-1.47x)"  # no verdict without its band
    assert summary(compare_like(), detail=True).shape[1] > 7  # the full table on request
    check_readable(memory_model.scale_table())
    from course_utils import lora
    check_readable(lora.routes_table(lora.routes("7B")))
    ledger = claims.claims_table([claims.verdict("C10")])
    check_readable(ledger.drop(columns="says"))


def test_summary_prints_numbers_at_their_significant_figures():
    """'109.0' claimed a digit the rounding did not keep, beside 'peak allocated 109.43' two cells
    later; on an H100 '23000.0' beside '23030.55' read as two measurements. Three significant
    figures, written as a reader writes them, and read back by float(cell.replace(',', ''))."""
    from course_utils.experiments import round_sig
    df = compare_like()
    df["peak_allocated"] = [109.43 * MiB, 23030.55 * MiB, 67.14 * MiB, 0.5 * MiB]
    df["step_time_s"] = [4.5912, 0.1261, 0.0835, 0.2]
    s = summary(df)
    assert s["peak MiB"].tolist() == ["109", "23,000", "67.1", "0.5"]
    assert s["step ms"].tolist() == ["4,590", "126", "83.5", "200"]
    for col in ("step ms", "peak MiB", "est peak MiB", "saved MiB", "est saved MiB"):
        assert not any(cell.endswith(".0") for cell in s[col]), (col, s[col].tolist())
    # the browser test's reading gives the rounded value back
    assert [float(c.replace(",", "")) for c in s["peak MiB"]] == [
        round_sig(v / MiB) for v in df["peak_allocated"]]
    with pytest.raises(AssertionError, match="raw bytes"):   # a raw count written with commas
        check_readable(pd.DataFrame({"peak": ["68,776,156"]}))


def test_the_table_checker_rejects_a_wide_raw_table():
    old = compare_like()[["label", "step_time_s", "time_ratio", "tokens_per_s", "peak_allocated",
                          "est_peak_allocated", "peak_ratio", "saved_total", "est_saved_total",
                          "saved_ratio", "activations", "autocast_weight_copies"]]
    with pytest.raises(AssertionError, match="columns"):
        check_readable(old.set_index("label"))
    with pytest.raises(AssertionError, match="raw bytes"):
        check_readable(pd.DataFrame({"peak": [68776156]}))


# --- 5. no emulated time on a time axis ------------------------------------------------------

def time_axis_values(fig: Figure) -> list[float]:
    """Every bar height on an axis whose y label says time, and every point's x on an axis whose
    x label says time (ms)."""
    values = []
    for ax in fig.axes:
        if "time" in ax.get_ylabel():
            values += [p.get_height() for p in ax.patches if hasattr(p, "get_height")]
        if "time" in ax.get_xlabel():
            for line in ax.lines:
                values += list(np.atleast_1d(line.get_xdata()).astype(float))
            for coll in ax.collections:
                offs = coll.get_offsets()
                if len(offs):
                    values += list(np.asarray(offs)[:, 0])
    return values


def check_no_emulated_time(fig: Figure, emulated_ms: float) -> None:
    assert not any(abs(v - emulated_ms) < 1e-6 * emulated_ms for v in time_axis_values(fig)), \
        f"an emulated time ({emulated_ms:.0f} ms) is drawn on a time axis"


def caption_of(fig: Figure) -> str:
    """The text under a chart: its legend's title, or its x label."""
    texts = [lg.get_title().get_text() for lg in fig.legends]
    if fig._supxlabel is not None:
        texts.append(fig._supxlabel.get_text())
    return " ".join(texts)


def emulated_table() -> pd.DataFrame:
    df = compare_like().iloc[:3].copy()
    df["label"] = ["fp32", "fp32+full", "bf16"]
    df["step_time_s"] = [0.40, 0.52, 4.3]
    df["time_ratio"] = [1.0, 1.3, 10.75]
    df["time_ratio_low"], df["time_ratio_high"] = df["time_ratio"] * 0.97, df["time_ratio"] * 1.03
    df["time_verdict"] = ["reference", "slower", "emulated"]
    df["emulated"] = [False, False, True]
    df["step_time_iqr_s"] = [0.01, 0.01, 0.0]
    df["logits"] = 1e6
    return df


def test_no_chart_draws_an_emulated_time_on_a_time_axis():
    from course_utils.plots.ladder import adoption_story
    df = emulated_table()
    emulated_ms = 4300.0
    fig = plots.comparison_chart(df, title="the ladder")
    check_no_emulated_time(fig, emulated_ms)
    assert "Not drawn on the time axis" in caption_of(fig)
    check_no_emulated_time(plots.pareto_chart(df), emulated_ms)
    story = adoption_story(df, [("fp32", "fp32"), ("+ bf16 autocast", "bf16"),
                                ("+ full checkpointing", "fp32+full")])
    check_no_emulated_time(plots.adoption_chart(story), emulated_ms)


def test_a_time_panel_of_one_native_bar_is_left_out_and_the_title_says_so():
    df = emulated_table().iloc[[0, 2]]        # fp32 native, bf16 emulated: nothing to compare
    assert df["emulated"].tolist() == [False, True]
    fig = plots.comparison_chart(df, title="fp32 and bf16")
    assert len(fig.axes) == 2 and "step time" not in [ax.get_title() for ax in fig.axes]
    assert "step time not drawn" in fig._suptitle.get_text()
    assert len(plots.comparison_chart(emulated_table(), title="the ladder").axes) == 3


def test_the_chart_checker_rejects_an_emulated_bar():
    fig = Figure()
    ax = fig.subplots()
    ax.bar([0, 1], [400.0, 4300.0])
    ax.set_ylabel("step time (ms)")
    with pytest.raises(AssertionError, match="emulated time"):
        check_no_emulated_time(fig, 4300.0)


# --- 6. the body speaks of the subject --------------------------------------------------------

#: Words about the course's own machinery rather than mixed precision and checkpointing.
MACHINERY = re.compile(
    r"\b(course_utils|compare\(\)|summary\(\)|evidence|engine|verdicts?|rules?|profiles?|"
    r"alternation|alternate|rounds?|ledger|store|tests?|generated|smoke|COURSE_SIZE|kernel|"
    r"nbval|grader|docstrings?|per-round|interleaved|helpers?|library|pytest|noise bands?)\b",
    re.IGNORECASE)


def machinery_share(nb) -> float:
    words = hits = 0
    for c in nb.cells:
        if c.cell_type != "markdown" or c.get("id") == "how-measured":
            continue
        words += len(re.findall(r"\w+", c.source))
        hits += len(MACHINERY.findall(c.source))
    return hits / max(words, 1)


def test_the_machinery_checker_rejects_a_body_about_the_engine():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "The engine's verdicts come from one rule per claim; a test keeps the two texts "
        "identical, and compare() times the rounds in alternation at the smoke profile.")])
    assert machinery_share(nb) > 0.05


def check_ratio_inside_band(text: str) -> None:
    """The printed ratio lies inside its printed band (same direction)."""
    for m in re.finditer(r"(\d+\.\d+)x(?: faster| slower)? \(noise band (\d+\.\d+)-(\d+\.\d+)x", text):
        r, lo, hi = (float(g) for g in m.groups())
        assert lo <= r <= hi, f"{m.group(0)!r}: the ratio lies outside its band"


def test_a_printed_ratio_lies_inside_its_printed_band():
    rng = np.random.default_rng(1)
    for centre in np.linspace(0.6, 1.4, 33):
        for spread in (0.01, 0.1, 0.3):
            ratios = centre * np.exp(spread * rng.standard_normal(7))
            check_ratio_inside_band(time_ratio(list(ratios), [1.0] * 7, size="cpu").describe())
    with pytest.raises(AssertionError):   # lesson 03's C20 line before this check existed
        check_ratio_inside_band("time per token 0.88x (noise band 0.93-1.68x over 5 rounds): within noise")


def test_the_notebook_output_rules_catch_a_wide_table_and_an_emulated_verdict():
    """The rules tests/conftest.py applies to every notebook cell's outputs (issue 24)."""
    import pandas as pd
    from nbcells import shown_problems, table_columns
    wide = pd.DataFrame({c: [1] for c in "abcdefg"})
    assert table_columns(wide._repr_html_()) == [7]
    assert table_columns(pd.DataFrame({c: [1] for c in "abc"}).set_index("a")._repr_html_()) == [2]
    assert shown_problems([{"data": {"text/html": wide._repr_html_()}}])
    assert not shown_problems([{"data": {"text/html": wide.iloc[:, :6]._repr_html_()}}])
    assert shown_problems([{"output_type": "stream", "text": "bf16 (emulated) 3.1x slower\n"}])
    assert not shown_problems([{"output_type": "stream",
                                "text": "bf16: about 30x the reference's (emulated here)\n"}])
