"""The notebooks as documents. First the rules every lesson keeps, each one test parametrised over
the lessons (the library-text identity table, "a chart cell ends with its chart", one verdict per
claim, objectives and summary, the setup cell, the measuring box); then the checks of one
lesson's own cells. Every test reads cells through the one helper, ``nbcells``.
"""
from __future__ import annotations

import ast
import inspect
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from nbcells import LESSONS, ROOT, cell, code, code_cells, markdown, notebook, python
from test_telling import machinery_share  # the issue-18 checker of the telling, the same rule

import course_utils.checkpointing as ck
from course_utils import lora, model_zoo, nonfinite, plots
from course_utils.checkpointing import SAVE
from course_utils.claims import CLAIMS, verdict
from course_utils.config import config_for
from course_utils.data import get_batch
from course_utils.i18n import tr
from course_utils.models import build_model
from course_utils.profiling import find_blocks, wrap_blocks
from course_utils.saved_tensors import saved_bytes
from course_utils.training import train_step

LESSON = {p.stem[:2]: p for p in LESSONS}
SOLUTION = {n: ROOT / "solutions" / f"{n}.ipynb" for n in ("03_combined_stack", "05_llama_block")}
#: Every exercise's source notebook.
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
EXERCISE03 = ROOT / "exercises" / "03_combined_stack.ipynb"


def lesson_ids(paths):
    return [p.stem for p in paths]


# ============================================================ rules every lesson keeps

def test_lessons_are_numbered_from_01():
    assert LESSONS, "no lesson notebooks found"
    assert [p.name[:2] for p in LESSONS] == [f"{i:02d}" for i in range(1, len(LESSONS) + 1)]


@pytest.mark.parametrize("path", LESSONS, ids=lesson_ids(LESSONS))
def test_a_lesson_starts_with_objectives_and_ends_with_its_summary(path):
    nb = notebook(path)
    assert "learning objectives" in nb.cells[0].source.lower(), \
        f"{path.name}: list the learning objectives first"
    summary = cell(nb, "summary")
    assert "## Summary" in summary.source
    assert re.search(r"^## (What to try|Try) next", summary.source, re.MULTILINE)
    after = nb.cells[nb.cells.index(summary) + 1:]  # at most the lesson's own timing line
    assert all(c.cell_type == "code" and "this lesson ran in" in c.source for c in after), \
        [c.get("id") for c in after]


def _library_definitions(source: str) -> dict:
    """Top-level ``def`` and ``NAME = ...`` statements of ``source``: name -> their exact text."""
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = ast.get_source_segment(source, node)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = ast.get_source_segment(source, node)
    return out


CHECKPOINTING = _library_definitions(inspect.getsource(ck))

#: The library-text identity table: (lesson, cell, what the cell must be). A whole cell equals the
#: library's source of the objects named; "definitions" cells define these names with the text of
#: course_utils.checkpointing's.
IDENTICAL = [
    ("01", "recipe-accum", "whole", (train_step,)),
    ("01", "guards-code", "whole", (nonfinite.guarded_step,)),
    ("03", "lora-code", "whole", (lora.LoRALinear, lora.add_lora)),
    ("02", "segments-loop", "definitions", ("run_blocks", "checkpoint_every_segment")),
    ("02", "sac-policy", "definitions", ("aten", "SAVE", "save_matmuls_and_attention")),
]


@pytest.mark.parametrize("lesson, cell_id, how, what", IDENTICAL,
                         ids=[f"{n}-{c}" for n, c, _, _ in IDENTICAL])
def test_a_cell_that_shows_library_code_is_the_librarys_text(lesson, cell_id, how, what):
    source = cell(LESSON[lesson], cell_id).source
    if how == "whole":
        want = "\n\n\n".join(inspect.getsource(obj).strip() for obj in what)
        assert source.strip() == want, f"lesson {lesson} cell {cell_id!r} differs from the library"
        return
    shown = _library_definitions(source)
    for name in what:
        assert name in shown, f"lesson {lesson} cell {cell_id!r} no longer defines {name}"
        assert shown[name] == CHECKPOINTING[name], (
            f"lesson {lesson} cell {cell_id!r} shows a {name} that differs from "
            f"course_utils.checkpointing.{name}: make them the same text (the lesson shows the "
            "library's code)")
    if "checkpoint_every_segment" in what:
        fn = ck.checkpoint_every_segment
        assert textwrap.dedent(inspect.getsource(fn)).rstrip() == shown["checkpoint_every_segment"]
        assert "segment_bounds(" in shown["checkpoint_every_segment"]  # the library's one rule


def test_the_identity_table_sees_a_drifted_cell():
    # The comparison itself can fail: the drift lesson 02 once had (an extra baddbmm) is caught.
    drifted = CHECKPOINTING["SAVE"].replace("aten.bmm.default,",
                                            "aten.bmm.default, aten.baddbmm.default,")
    assert _library_definitions(drifted)["SAVE"] != CHECKPOINTING["SAVE"]
    assert _library_definitions(CHECKPOINTING["SAVE"])["SAVE"] == CHECKPOINTING["SAVE"]


#: Charts that describe no run of the lesson's model, so they name no size profile.
SIZE_FREE = {"styled_claims", "format_range_chart", "scaler_trace_chart", "scale_chart",
             "routes_chart", "sharding_chart"}
#: Fewest chart cells per lesson (the rule below must have something to check; lesson 02 draws one
#: block's saved tensors once, in §2, beside its checkpointed version).
CHART_CELLS = {"01": 7, "02": 7, "03": 5, "04": 1, "05": 0}


def _chart_call(node, charts):
    """The chart function's name if ``node`` calls one (``name(...)`` or ``plots.name(...)``)."""
    if not isinstance(node, ast.Call):
        return None
    f = node.func
    name = f.id if isinstance(f, ast.Name) else (
        f.attr if isinstance(f, ast.Attribute) and getattr(f.value, "id", None) == "plots" else None)
    return name if name in charts else None


@pytest.mark.parametrize("path", LESSONS, ids=lesson_ids(LESSONS))
def test_a_chart_cell_ends_with_its_chart(path):
    """A cell that draws a chart ends with the chart call (a chart made without pyplot shows
    only as a cell's last expression), never hidden by ';', and names the size profile it
    measured (``size=``) unless the chart describes no run of the model."""
    charts = set(plots.__all__)
    seen = 0
    for c in code_cells(path):
        tree = ast.parse(python(c.source))
        if not any(_chart_call(n, charts) for n in ast.walk(tree)):
            continue
        seen += 1
        last = tree.body[-1]
        name = _chart_call(last.value, charts) if isinstance(last, ast.Expr) else None
        assert name, f"{path.name} cell {c.id!r}: a chart must be the cell's last expression"
        assert not c.source.rstrip().endswith(";"), f"{path.name} cell {c.id!r} hides its chart"
        if name not in SIZE_FREE:
            assert any(k.arg == "size" for k in last.value.keywords), \
                f"{path.name} cell {c.id!r}: pass size= to {name}"
    assert seen >= CHART_CELLS[path.stem[:2]], f"{path.name}: {seen} chart cells"


#: The claims each lesson judges with ``verdict("Cn", ...)``, each exactly once.
VERDICTS = {"01": {"C1", "C2", "C11", "C12", "C13", "C16", "C18"},
            "02": {"C4", "C5", "C6", "C7", "C8", "C14", "C15"},
            "03": {"C1", "C2", "C3", "C4", "C5", "C7", "C9", "C10", "C16", "C17", "C20"},
            "04": {"C19"}, "05": set()}


@pytest.mark.parametrize("path", LESSONS, ids=lesson_ids(LESSONS))
def test_one_verdict_per_claim_from_the_engine(path):
    """Each claim a lesson judges is one ``verdict(...)`` call of the claims engine: no Verdict
    built by hand, no status word typed by the lesson."""
    calls = {}
    for c in code_cells(path):
        src = python(c.source)
        assert "Verdict(" not in src and "import Verdict" not in src, \
            f"{path.name} cell {c.id!r} builds a Verdict by hand: call verdict()"
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "verdict":
                calls.setdefault(node.args[0].value, []).append(c.id)
    assert set(calls) == VERDICTS[path.stem[:2]], calls
    assert all(len(where) == 1 for where in calls.values()), calls
    assert not re.search(r'"(held|busted|failed|depends|not measured here)"', code(path))


@pytest.mark.parametrize("path", LESSONS, ids=lesson_ids(LESSONS))
def test_the_setup_cell_chooses_the_threads_once(path):
    """docs/method.md#time: torch's threads are chosen once per machine and kept for every
    lesson, lesson 04 included (its phase split measures memory in-process)."""
    assert code(path).count("use_threads()") == 1
    assert "use_threads()" in cell(path, "setup").source


@pytest.mark.parametrize("path", LESSONS, ids=lesson_ids(LESSONS))
def test_machinery_words_stay_out_of_the_lesson(path):
    """Issue 24: how the course measures is on docs/method.md; a lesson links it instead of
    opening with a "How this lesson measures" box (lessons not yet rewritten keep theirs)."""
    nb = notebook(path)
    boxes = [c for c in nb.cells if c.get("id") == "how-measured"]
    if boxes:
        assert len(boxes) == 1 and "How this lesson measures" in boxes[0].source
    else:
        assert "(../docs/method.md" in markdown(nb)
    assert machinery_share(nb) <= 0.05, f"{machinery_share(nb):.1%} machinery words"


# ============================================================ lesson 01

def _fresh(cfg):
    model = build_model(cfg)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_lesson01_recipes_do_what_train_step_does(precision):
    """bf16_step / fp16_step of §5, step for step, leave the same parameters as the course's
    train_step with one micro-batch (GradScaler disabled for bf16, enabled for fp16)."""
    ns = {"torch": torch}
    for cell_id in ("recipe-bf16", "recipe-fp16"):
        exec(compile(cell(LESSON["01"], cell_id).source, cell_id, "exec"), ns)  # noqa: S102 - the lesson's cell
    bf16_step, fp16_step = ns["bf16_step"], ns["fp16_step"]
    cfg = config_for("smoke", device="cpu")
    batches = [get_batch(cfg.batch_size, cfg.seq_len, step=i) for i in range(2)]
    (m1, o1), (m2, o2) = _fresh(cfg), _fresh(cfg)
    s1 = torch.amp.GradScaler("cpu", enabled=precision == "fp16")
    s2 = torch.amp.GradScaler("cpu", enabled=precision == "fp16")
    for x, y in batches:
        if precision == "bf16":
            bf16_step(m1, o1, x, y)
        else:
            fp16_step(m1, o1, s1, x, y)
        train_step(m2, o2, s2, [(x, y)], torch.bfloat16 if precision == "bf16" else torch.float16)
    assert all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters()))
    assert s1.get_scale() == s2.get_scale()
    # and the parameters did move (a recipe that skipped the step would also "agree")
    assert not all(torch.equal(p, q) for p, q in zip(m1.parameters(), build_model(cfg).parameters()))


def test_lesson01_the_recipes_markdown_promises_no_bitwise_equality():
    """An H100 printed 'same parameters: False' under "it does exactly what bf16_step does": the
    markdown says what the check prints, not which answer to expect."""
    text = cell(LESSON["01"], "recipe-accum-md").source
    assert "exactly what" not in text and "bitwise equal" in text and "GPU" in text


def test_lesson01_what_is_saved_in_fp32_is_read_from_the_recording():
    """On CUDA cross_entropy's log-softmax ran in bf16 (an H100 recorded `_log_softmax` with a bf16
    output) while the markdown said it was saved in fp32; then the markdown said "on a CPU, not
    on CUDA", which the docs' CUDA list (log_softmax among the fp32 ops) seems to contradict.
    The lesson states the docs' lists with their source and the explicit-dtype rule that decides
    the loss's case, and prints what this device did; its prose names no device where the
    log-softmax is fp32."""
    assert 'ops.ops_by_dtype(exclude="layers").get("fp32"' in cell(LESSON["01"], "cache").source
    docs = cell(LESSON["01"], "autocast-md").source
    for source in ("Autocast Op Reference", "autocast_mode.cpp", "Op Eligibility", "log_softmax",
                   "cross_entropy_loss"):
        assert source in docs, source
    assert "last row" in cell(LESSON["01"], "cache-read").source
    for c in notebook(LESSON["01"]).cells:
        if c.cell_type == "markdown":
            assert not re.search(r"(on a CPU|on CUDA)[^.]*log.softmax|log.softmax[^.]*(on a CPU|on CUDA)",
                                 c.source), c.id


def test_lesson01_tells_the_flushed_trend_from_its_run():
    assert "flushed_trend(plain[" in cell(LESSON["01"], "train-table").source
    read = cell(LESSON["01"], "train-read").source
    assert "usually grows" not in read and "line printed above table (A)" in read


def test_lesson01_section8_runs_on_a_t4_with_arms_the_guard_accepts(capsys):
    """On a Colab T4, the GPU "Try next" recommends, the guard refuses bf16 (emulated): §8 once
    stopped there, and its table and C13 failed after it. The lesson's own cells of §8, run with
    a T4's HardwareInfo, hand train_arms only arms the guard accepts on a T4, say what they left
    out, and judge C13 without a bf16 training run."""
    import math

    from helpers import arm_history

    from course_utils.formats import format_table
    from course_utils.guard import check_feasible
    from course_utils.hardware import HardwareInfo, is_emulated
    from course_utils.training_arms import (
        HARM,
        Arm,
        feasible_arms,
        flushed_trend,
        relative_gap,
        results_table,
        shows_harm,
    )
    t4 = HardwareInfo(device="cuda", name="Tesla T4", compute_capability=(7, 5), native_bf16=False,
                      fp16_fast=True, bf16_emulated=True)
    calls = []

    def train_arms_on_t4(config, arms, steps, **kwargs):
        for a in arms:  # what train_arms asks first, here on the T4
            check_feasible(config.replace(precision=a.precision), t4)
        calls.append([a.label for a in arms])
        return {a.label: arm_history(a.label, [5.0, 4.0], [0.0] * steps) for a in arms}

    ns = {"math": math, "hw": t4, "is_emulated": is_emulated, "DEVICE": "cpu", "size": "cpu", "tr": tr,
          "config_for": config_for,
          "Arm": Arm, "feasible_arms": feasible_arms, "train_arms": train_arms_on_t4,
          "loss_curves_chart": lambda *a, **k: None, "results_table": results_table,
          "relative_gap": relative_gap, "shows_harm": shows_harm, "flushed_trend": flushed_trend,
          "verdict": verdict, "verdicts": [], "bf16_plain": {"flushed": 0.0},
          "table": format_table(), "HARM": HARM}
    for cell_id in ("train", "train-table", "c13", "train-scaled", "train-scaled-table"):
        exec(compile(python(cell(LESSON["01"], cell_id).source), cell_id, "exec"), ns)  # noqa: S102
    out = capsys.readouterr().out
    assert calls[0] == ["fp32", "fp16, no scaler"]                 # (A) without bf16
    assert calls[1] == ["fp32", "fp16 + GradScaler", "fp16, no scaler"]   # (B) as everywhere
    assert "(A) leaves out bf16: bf16 on Tesla T4 is emulated" in out and "(A) 2 runs" in out
    c13 = ns["verdicts"][-1]
    assert c13.claim == "C13" and "validation loss" not in c13.evidence


def test_lesson01_prose_types_no_measured_ratio():
    """Markdown states no speed or memory ratio (e.g. "fp16 ~200x slower", "0.03x"): those are
    printed from this run's numbers."""
    ratio = re.compile(r"~?\b\d+(?:\.\d+)?\s?x\b(?!\s*\d)")
    nb = notebook(LESSON["01"])
    for c in nb.cells:
        if c.cell_type == "markdown":
            found = [m.group(0) for m in ratio.finditer(c.source)]
            assert not found, f"{c.id}: {found}"
    assert "fp16 ~200x" not in "".join(c.source for c in nb.cells)


def test_lesson01_links_the_method_page_instead_of_a_measuring_box():
    nb = notebook(LESSON["01"])
    assert not any(c.get("id") == "how-measured" for c in nb.cells)
    prose = markdown(LESSON["01"])
    assert prose.count("](../docs/method.md") == 1
    words = sum(len(c.source.split()) for c in nb.cells if c.cell_type == "markdown")
    assert words <= 2600, f"{words} words of markdown (issue 24: at most 2,600)"


def test_lesson01_prints_an_emulated_step_time_once():
    """Issue 24: an emulated bf16 step time was printed 49.33x, 31.30x and 27.20x in one run. The
    table says it once, rounded; the C1 line gets no emulated time; no cell prints a ratio of
    its own."""
    src = cell(LESSON["01"], "c1-c2").source
    assert "low_time.describe(" not in src and "bf16_time=low_time if native_bf16 else None" in src


def test_lesson01_nan_section_runs_its_faults_and_guards_on_the_course_model(capsys):
    """§6's own cells, on the smoke model: fp16 + GradScaler skips and backs off, bf16 without a
    guard ends with every parameter non-finite, and each guard reports both faults."""
    import contextlib

    import pandas as pd

    from course_utils.nonfinite import GUARDS, nan_in_weight, nonfinite_parameters, overflow
    from course_utils.terms import autocast_dtype
    from course_utils.training import StepCounter
    tiny = config_for("smoke", device="cpu")
    shown = []
    ns = {"contextlib": contextlib, "pd": pd, "torch": torch, "build_model": build_model,
          "get_batch": get_batch, "tiny": tiny, "DEV_TYPE": "cpu", "DEVICE": "cpu",
          "nan_in_weight": nan_in_weight, "overflow": overflow, "StepCounter": StepCounter,
          "train_step": train_step, "autocast_dtype": autocast_dtype,
          "nonfinite_parameters": nonfinite_parameters, "GUARDS": GUARDS,
          "guarded_step": nonfinite.guarded_step, "display": shown.append, "tr": tr}
    faults = None
    for cell_id in ("nan-faults", "guards-run"):
        source = cell(LESSON["01"], cell_id).source
        tree = ast.parse(source)
        last = tree.body.pop() if isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, cell_id, "exec"), ns)  # noqa: S102 - the lesson's cell
        if last is not None:
            faults = eval(compile(ast.Expression(last.value), cell_id, "eval"), ns)  # noqa: S307
    n = len(list(build_model(tiny).parameters()))
    assert faults.loc[("NaN in a weight", "fp16 + GradScaler"), "optimizer step"] == "skipped"
    assert faults.loc[("overflow", "fp16 + GradScaler"), "scale after"] == "32768"
    assert faults.loc[("overflow", "bf16"), "parameters with inf/NaN"] == f"{n} of {n}"
    guards = shown[0]
    assert guards.loc["skip", "overflow"] == f"skipped the step; after it, 0 of {n} parameters hold inf/NaN"
    assert all(not guards.loc[g, f].startswith("nothing") for g in GUARDS[1:] for f in guards.columns)


def test_lesson01_setup_probes_the_matmuls_and_speaks_of_its_subject():
    setup = cell(LESSON["01"], "setup").source
    assert "matmul_probe(" in setup and "report(hw, probe)" in setup
    prose = " ".join(c.source for c in notebook(LESSON["01"]).cells if c.cell_type == "markdown")
    assert "TF32" in prose and "failed" not in prose


# ============================================================ lesson 02

def test_lesson02_setup_plans_from_the_recipe_and_teaches_the_segment_rule_as_its_formula():
    assert "precision=recipe.precision" in cell(LESSON["02"], "setup").source
    prose = " ".join(c.source for c in notebook(LESSON["02"]).cells if c.cell_type == "markdown")
    # the segment rule as §4's formula gives it: sqrt(cN), one block per segment only when N <= c
    assert "√(cN)" in prose and "N ≤ c" in prose
    assert "for transformer blocks, checkpoint every block" not in prose.lower()
    assert "cannot fix" not in prose
    assert "MUST_CPU_OFFLOAD" in prose or "CPU-offload" in prose or "CPU offload" in prose


def _markdown_words(path) -> int:
    return sum(len(c.source.split()) for c in notebook(path).cells if c.cell_type == "markdown")


def test_lesson02_and_exercise02_say_less():
    """Issue 24: a lesson at most 3,000 words of markdown, an exercise at most 1,500; the
    exercise links the grading page once and its quiz cells carry no explanation (it stays out
    of sight until the answer is right: course_utils.quizzes)."""
    assert _markdown_words(LESSON["02"]) <= 3000
    exercise = ROOT / "solutions" / "02_checkpointing.ipynb"
    assert _markdown_words(exercise) <= 1500
    prose = " ".join(c.source for c in notebook(exercise).cells if c.cell_type == "markdown")
    assert prose.count("../docs/method.md#grading") == 1 and "How it is graded" not in prose
    quiz_cells = [c for c in code_cells(exercise) if "quiz.check(" in c.source]
    assert len(quiz_cells) == 3
    assert not any("explanation=" in c.source or re.search(r"\bC\d+\b", c.source) for c in quiz_cells)


def test_lesson02_shows_committed_gpu_runs_as_someone_elses():
    """A committed H100 table once sat under "Every number below comes from this run"."""
    prose = " ".join(c.source for c in notebook(LESSON["02"]).cells if c.cell_type == "markdown")
    assert "comes from this run" not in prose and "Every number below" not in prose
    assert "committed_runs()" in cell(LESSON["02"], "gpu-runs").source
    said = cell(LESSON["02"], "gpu-runs-md").source
    assert "not from this run" in said and "day" in said


def test_lesson02_states_claim_c5_once_from_the_code():
    """C5 read "20-33 %" in one cell and "20-40 %" in another: the markdown types neither; the
    cell prints the claim as course_utils.claims states it."""
    prose = " ".join(c.source for c in notebook(LESSON["02"]).cells if c.cell_type == "markdown")
    for typed in ("20-33", "20–33", "20-40", "20–40"):
        assert typed not in prose, typed
    assert "CLAIMS[v.claim]" in cell(LESSON["02"], "c4c5").source


def test_lesson02_the_memory_budget_is_told_as_torch_defines_it():
    """torch/_functorch/config.py: 0.0 is checkpointing the whole compiled region, 1.0 the
    default partitioner (which already recomputes); not "keeps at most a fraction B"."""
    text = cell(LESSON["02"], "budget-md").source
    assert "fraction" not in text and "keeps everything" not in text
    assert "1.0 is that default" in text and "0.0 is the memory of checkpointing the whole" in text
    doc = ck.__doc__ + ck.CompiledUnderBudget.__doc__
    assert "at most the fraction" not in doc and "checkpointing the whole" in doc


def test_lesson02_the_attention_cell_says_where_its_sequence_lengths_stop():
    """§7 said the lengths stop where one block's seq x seq matrices pass 1 GiB; at the cpu size
    they stop at 8T (128 MiB), and only the h100 size is cut by that cap."""
    import contextlib
    import io
    from types import SimpleNamespace

    from course_utils.i18n import tr
    body = ast.parse(cell(LESSON["02"], "attention").source).body
    head = ast.Module([n for n in body[:3]], [])  # candidates, lengths, the sentence
    for size, capped in (("cpu", False), ("h100", True)):
        c = config_for(size)
        ns = {"T": c.seq_len, "B": c.batch_size, "cfg": SimpleNamespace(n_heads=c.n_heads), "tr": tr}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(head, "attention", "exec"), ns)
        lengths = ns["lengths"]
        assert all(c.batch_size * c.n_heads * L * L * 4 <= 2**30 for L in lengths)
        assert (len(lengths) < len(ns["candidates"])) == capped, size
        assert f"{lengths[0]} to {lengths[-1]}" in out.getvalue()
        assert ("would pass 1 GiB" in out.getvalue()) == capped, out.getvalue()
    md = cell(LESSON["02"], "s7").source
    assert "stop where one block's seq × seq matrices would pass 1 GiB" not in md


def test_lesson02_the_reentrant_cell_comments_a_will_raise_that_did_not_happen(cfg, capsys):
    import warnings

    from course_utils.i18n import tr
    ns = {"tr": tr, "torch": torch, "checkpoint": torch.utils.checkpoint.checkpoint, "warnings": warnings,
          "build_model": build_model, "cfg": cfg, "B": cfg.batch_size, "T": cfg.seq_len,
          "d": cfg.d_model, "device": "cpu"}
    exec(compile(cell(LESSON["02"], "reentrant-default").source, "reentrant-default", "exec"), ns)
    out = capsys.readouterr().out
    promised = any("will raise" in str(w.message) for w in ns["caught"])
    ran = ns["ran"]
    assert ns["outcome"].startswith("ran") == ran
    assert ("has not happened in torch" in out) == (promised and ran), out


def test_lesson02_hugging_face_cells_run_without_transformers(monkeypatch, capsys):
    from course_utils.i18n import tr
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    namespace = {"torch": torch, "tr": tr}
    for cell_id in ("hf", "hf-keeps", "hf-cache"):
        exec(compile(cell(LESSON["02"], cell_id).source, cell_id, "exec"), namespace)
    out = capsys.readouterr().out
    assert "pip install transformers" in out and namespace["transformers"] is None
    assert namespace["cache_bytes"](None) == 0


# ============================================================ lesson 03 and exercise 03

def test_lesson03_the_ladder_and_the_race_run_the_cells_step():
    for cell_id in ("ladder", "race"):
        assert "step_fn=train_step" in cell(LESSON["03"], cell_id).source, cell_id
    # the library's step, which lesson 01 prints (said once): no copy here could drift from it
    defs = [c.id for c in code_cells(LESSON["03"])
            if re.search(r"^def train_step\b", c.source, re.MULTILINE)]
    assert defs == []
    assert "from course_utils.training import train_step" in cell(LESSON["03"], "setup").source
    assert "adapt=add_lora" in cell(LESSON["03"], "lora-measure").source


def test_lesson03_the_ledger_is_one_engine_call_per_claim_in_order():
    """Each claim once, in order: lesson 03's own verdicts (``verdict``) and the other lessons'
    (``from_lesson``: the verdict that lesson recorded here, or measured again and labelled)."""
    src = cell(LESSON["03"], "ledger").source
    table = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call)
                 and getattr(n.func, "id", None) == "claims_table")
    named = []
    for entry in table.args[0].elts:   # a call, or a choice of two calls on the same claim
        ids = {c.args[0].value for c in ast.walk(entry) if isinstance(c, ast.Call)
               and getattr(c.func, "id", None) in ("verdict", "from_lesson")}
        assert len(ids) == 1, ast.unparse(entry)
        named += ids
    assert named == list(CLAIMS), "each claim C1-C20 once, in order"
    assert "claims.recorded_or_measure(" in src


def test_lesson03_plans_from_the_recipe_and_the_dashboard_cell_is_one_line():
    assert "recommend_precision(hw)" in cell(LESSON["03"], "setup").source
    assert cell(LESSON["03"], "dashboard").source.strip() == "dashboard()"


def test_lesson03_the_wrong_facts_are_gone():
    prose = markdown(LESSON["03"])
    assert "does not move" not in prose                  # the peak moves between recipes
    assert "the size of the parameters" not in prose    # AdamW's temporary: as memory_model counts it
    assert "LoRA" in prose and "fits" in prose          # the 7B route that fits
    for word in ("BatchNorm", "scheduler", "no_sync"):  # accumulation's caveats
        assert word in prose
    # every sentence with a measured result is printed by code: no measured-looking figure in prose
    assert not re.search(r"\d+\.\d+ ?(GiB|MiB)|\d+\.\d+x", prose)
    # measured results once stated as facts of every run (audit C, findings 5, 6, 14)
    assert "its gain from a larger batch is small" not in prose   # a CPU's batch gain: measured, §4
    assert "Selective checkpointing sits in between." not in prose  # in memory yes; in time, measured
    assert "print(result.reading())" in cell(LESSON["03"], "race").source
    assert "sel_time.describe(" in cell(LESSON["03"], "ladder-read").source
    assert "fp16 beside it on a GPU whose recipe is bf16" in cell(LESSON["03"], "s2").source


def test_lesson03_sentences_name_configurations_in_words():
    """A learner reads "bf16 + full checkpointing, 2 micro-batches", never the short label
    "bf16+full+accum2": no f-string of the lesson prints a RunConfig's ``.label`` as it is."""
    for c in code_cells(LESSON["03"]):
        for node in ast.walk(ast.parse(c.source)):
            if isinstance(node, ast.FormattedValue):
                v = node.value
                assert not (isinstance(v, ast.Attribute) and v.attr == "label"), \
                    f"{c.id}: {ast.unparse(v)} printed as it is: use plain_label()"
    assert "plain_label(" in cell(LESSON["03"], "ladder-read").source
    for cell_id in ("budget", "step-once"):
        assert "plain_label(" in cell(LESSON["03"], cell_id).source, cell_id


def test_lesson03_says_less():
    """Issue 24: at most 3,000 words of markdown (with the logits section of §6), no
    measuring box, no line counted in prose ("the second line above" once named the third)."""
    nb = notebook(LESSON["03"])
    prose = markdown(LESSON["03"])
    assert len(prose.split()) <= 3000, len(prose.split())
    assert not any(c.get("id") == "how-measured" for c in nb.cells)
    assert "../docs/method.md" in cell(nb, "title").source
    assert not re.search(r"\b(first|second|third|fourth|last) (line|row)s? (above|below)", prose)
    assert "saves memory everywhere" not in prose          # the 7B peak is the same in every recipe
    assert "stays near one micro-batch" not in prose       # it exceeds it by up to the .grad buffer
    assert "needs the `bitsandbytes` package and a GPU" not in prose
    assert "torchao.optim.AdamW8bit" in cell(nb, "s7").source   # runs on a CPU too (issue 26)


def test_lesson03_no_emulated_precision_is_searched_or_raced():
    src = cell(LESSON["03"], "budget").source
    assert "candidates = [PLAIN, FULL, PLAIN.replace(checkpoint=\"selective\")]" in src
    assert 'PLAIN = base.replace(precision=RECIPE)' in cell(LESSON["03"], "ladder").source


@pytest.mark.parametrize("path", [LESSON["03"], SOLUTION["03_combined_stack"], EXERCISE03],
                         ids=["lesson", "solution", "exercise"])
def test_notebook_03_code_passes_ruff_with_long_lines_checked(path):
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.fail("ruff is not installed in this environment (pip install ruff)")
    out = subprocess.run([ruff, "check", "--line-length", "110", "--extend-select", "E501", str(path)],
                         capture_output=True, check=False, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


def test_exercise03_quiz_points_to_lesson_sections_and_q4_says_what_lesson_03_shows(capsys):
    """Issue 24: each quiz cell is quiz.check(question, answer), its bank's hint names a lesson 03
    section, never a claim ID; question 4 accepts what lesson 03 shows: the peak falls where the
    saved tensors set it and stays where the optimizer step sets it (the 7B table of §6)."""
    from course_utils import quiz
    bank = quiz.question_bank()
    nb = notebook(SOLUTION["03_combined_stack"])
    questions = [re.search(r"quiz\.check\('([^']+)', answer_\w+\(\)\)", c.source).group(1)
                 for c in nb.cells if "quiz.check(" in c.source]
    # exercise 02 asks whether checkpointing speeds training up: asked once, there
    assert questions == ["bf16-halves-memory", "autocast-adamw-bytes"]
    for q in questions:
        assert re.search(r"lesson 03 §\d", bank[q]["hint"]) and not re.search(r"\bC\d+\b", bank[q]["hint"])
    assert "stays where it is where the optimizer step sets it" in cell(nb, "part-c").source
    quiz.check("bf16-halves-memory", "b")
    out = capsys.readouterr().out
    assert "optimizer step" in out and "§6" in out and not re.search(r"\bC\d+\b", out)


def test_exercise03_grades_the_step_not_bookkeeping():
    """The step is one the lessons did not show (micro-batches of different lengths), graded
    against plain PyTorch (one big batch), with no course step to delegate to; Part B grades
    PyTorch's saved-tensor hooks, not the course's helpers."""
    nb = notebook(SOLUTION["03_combined_stack"])
    step = cell(nb, "q2-solution").source
    for piece in ("torch.autocast(", "checkpoint(block, h, use_reentrant=False)", "n_tokens",
                  "scaler.scale(loss).backward()", "scaler.unscale_(optimizer)", "clip_grad_norm_"):
        assert piece in step, piece
    assert "/ len(micro_batches)" not in step
    setup = cell(nb, "setup").source
    assert "train_step" not in setup and "compare" not in setup, "nothing to delegate to"
    assert "loss.backward()" in cell(nb, "q2-helpers").source   # the reference is plain PyTorch
    assert "saved_tensors_hooks" in cell(nb, "q3-solution").source
    assert "evidence.time_between" not in "\n".join(c.source for c in nb.cells)
    tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    quiz = [c for c in tests if "quiz.check(" in c.source]
    assert len(quiz) == 2, "two auto-checked conceptual questions (checkpointing and speed: exercise 02)"


# ============================================================ lesson 05 and exercise 05

def _definitions(source: str, names, namespace: dict) -> dict:
    """Execute the top-level definitions ``names`` (functions, classes) of a cell's source."""
    tree = ast.parse(source)
    keep = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names]
    assert {n.name for n in keep} == set(names), f"cell lost one of {names}"
    exec(compile(ast.Module(keep, []), "<cell>", "exec"), namespace)
    return namespace


def test_lesson05_block_finder_is_the_librarys_rule():
    ns = _definitions(cell(LESSON["05"], "find").source, ["repeated_blocks"], {"nn": nn})
    zoo = [model_zoo.course_gpt("smoke"), model_zoo.small_cnn(channels=8, n_blocks=2, image=8)]
    try:
        import transformers  # noqa: F401 - the [hf] extra: make test installs it
        zoo += [model_zoo.hf_causal_lm(t, n_layers=2, d_model=32, n_heads=2, seq_len=16)
                for t in ("gpt2", "llama")]
    except ImportError:
        pass
    for z in zoo:
        model = z.build()
        assert ns["repeated_blocks"](model)[0] == find_blocks(model)[0], z.name
    with pytest.raises(ValueError, match="no repeated blocks"):
        ns["repeated_blocks"](nn.Sequential(nn.Linear(2, 2), nn.ReLU()))


def test_lesson05_wrapper_keeps_what_the_librarys_keeps():
    ns = _definitions(cell(LESSON["05"], "find").source, ["repeated_blocks"], {"nn": nn})
    ns = _definitions(cell(LESSON["05"], "wrap").source, ["Checkpointed", "checkpoint_every_block"],
                      {**ns, "checkpoint": torch.utils.checkpoint.checkpoint})
    z = model_zoo.course_gpt("smoke")
    x, y = z.make_batch(2)

    def loss(model):
        return model(x, y)[1]

    mine, library = ns["checkpoint_every_block"](z.build()), wrap_blocks(z.build(), "full")
    assert saved_bytes(loss, mine, model=mine) == saved_bytes(loss, library, model=library)


def test_exercise05_solution_holds_at_other_shapes():
    solution = notebook(SOLUTION["05_llama_block"])
    ns = {"torch": torch, "nn": nn, "F": torch.nn.functional, "__name__": "block"}
    exec(compile(cell(solution, "block").source.split("\n\ntorch.manual_seed(0)")[0], "<block>",
                 "exec"), ns)
    _definitions(cell(solution, "q3-solution").source, ["predict_saved_bytes"], ns)
    for shape in ((1, 8, 16, 2, 48, 8), (4, 32, 64, 4, 192, 40), (2, 96, 48, 3, 160, 96)):
        batch, seq, d, h, hidden, max_seq = shape
        torch.manual_seed(0)
        block = ns["LlamaBlock"](d, h, hidden, max_seq)
        x = torch.randn(batch, seq, d, requires_grad=True)
        measured = saved_bytes(block, x, model=block)
        assert abs(ns["predict_saved_bytes"](*shape) / measured - 1) <= 0.05, shape


def test_exercise05_policy_keeps_the_librarys_save_list():
    from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext
    ns = {"torch": torch, "CheckpointPolicy": CheckpointPolicy}
    exec(compile(cell(SOLUTION["05_llama_block"], "q2-solution").source, "<q2>", "exec"), ns)
    ctx = SelectiveCheckpointContext(is_recompute=False)
    for op in SAVE:  # the course's save list (matmuls and every attention kernel)
        assert ns["matmul_policy"](ctx, op) == CheckpointPolicy.MUST_SAVE, op


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_quiz_explanations_stay_out_of_the_cells(path, capsys):
    # issue 24: an explanation gives the answer away, so it is not in the cell the learner reads
    # (not even as base64): a test cell is quiz.check(question, answer), and the question bank
    # (course_utils/quizzes/<exercise>.json) prints the explanation after a right answer; a wrong
    # one gets the hint, which names the lesson section to read again.
    from course_utils import quiz
    bank = quiz.question_bank()
    name = path.stem
    for c in notebook(path).cells:
        if "quiz.check(" not in c.source:
            continue
        call = next(n for n in ast.walk(ast.parse(python(c.source))) if isinstance(n, ast.Call)
                    and getattr(n.func, "attr", "") == "check")
        assert not call.keywords, f"{name}: the question's key, hint and text live in its bank"
        question = call.args[0].value
        assert question in bank, f"{name}: no bank holds {question!r}"
        assert re.search(r"lesson 0\d §\d", bank[question]["hint"]), bank[question]["hint"]
        entry = bank[question]
        wrong = -12345 if "digits" in entry else next(
            c for c in entry["choices"] if quiz.answer_key(question, c) != entry["key"])
        with pytest.raises(AssertionError, match=r"Hint: .*lesson 0\d §"):
            quiz.check(question, wrong)
        assert capsys.readouterr().out == ""


def _run(cell_id: str, namespace: dict) -> str:
    """Run lesson 05's cell ``cell_id`` in ``namespace`` (with the setup cell's `tr`); what it
    printed."""
    import contextlib
    import io

    from course_utils.i18n import tr
    namespace.setdefault("tr", tr)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(cell(LESSON["05"], cell_id).source, cell_id, "exec"), namespace)
    return out.getvalue()


def test_lesson05_the_cpu_card_budget_leaves_no_checkpointing_out():
    # a budget every policy met (full's peak at 4x the batch) made the card pick 'none' on every
    # CPU run; halfway between full's and none's peaks at the measured batch, none cannot fit
    from types import SimpleNamespace
    peaks = {"none": lambda b: 30 + 5 * b, "full": lambda b: 30 + 2 * b}
    ex = SimpleNamespace(peak=lambda b, policy: peaks[policy](b))
    seen = {}

    def recommend(prof, exs, budget, **kw):
        seen.update(budget=budget, **kw)
        return SimpleNamespace(text=lambda: "card", options_table=lambda: None)
    ns = {"hw": SimpleNamespace(device="cpu"), "ex": ex, "B": 4, "PRECISION": "fp32",
          "prof": None, "recommend": recommend, "device": "cpu"}
    _run("card", ns)
    assert ex.peak(4, "full") < seen["budget"] < ex.peak(4, "none")
    assert "halfway" in seen["budget_source"]


def test_lesson05_measures_the_course_gpt_in_this_machines_precision():
    tree = ast.parse(cell(LESSON["05"], "estimate-gpt").source)
    calls = {n.func.id: n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id in ("extrapolate", "estimate")}
    assert any(k.arg == "precision" for k in calls["extrapolate"].keywords)
    replace = next(n for n in ast.walk(calls["estimate"]) if isinstance(n, ast.Call)
                   and getattr(n.func, "attr", "") == "replace")
    assert "precision" in {k.arg for k in replace.keywords}


def test_lesson05_ladder_read_names_the_method_profile_called():
    transformers = pytest.importorskip("transformers")
    import pandas as pd
    from helpers import synthetic_profile

    from course_utils.profiling import hf_method
    prof = synthetic_profile({"none": [1.0] * 6, "full": [1.3] * 6, "hf": [1.3] * 6})
    for m in prof.measurements:
        m.saved_modules = pd.DataFrame({"module": ["layers.0.x", "head"], "nbytes": [2**20, 2**10]})
    out = _run("ladder-read", {"prof": prof, "PRECISION": "fp32", "MiB": 2**20,
                               "transformers": transformers, "display": lambda *a: None,
                               "hf_method": hf_method, "hw": SimpleNamespace(device="cpu")})
    # right under the ladder: on a CPU its offload row is not offloading (nothing is copied)
    assert "On this CPU nothing is copied, so the ladder's offload row" in out
    called = ("activation_checkpointing_enable()"
              if hasattr(transformers.PreTrainedModel, "activation_checkpointing_enable")
              else "gradient_checkpointing_enable()")
    assert f"Hugging Face's own {called} keeps" in out
    assert "bit-for-bit equal" in out



@pytest.mark.parametrize("path", LESSONS + SOLUTIONS,
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_lesson_and_exercise_keeps_its_word_budget(path):
    """Issue 24: a lesson is readable in about half an hour, at most 3,000 words of markdown; an
    exercise at most 1,500 (docs/method.md holds what a lesson no longer says)."""
    words = len(markdown(path).split())
    budget = 3000 if path.parent.name == "notebooks" else 1500
    assert words <= budget, f"{path.name}: {words} words of markdown (at most {budget:,})"
