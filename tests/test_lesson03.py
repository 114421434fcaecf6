"""Lesson 03 and exercise 03 as documents: the code they show is the library's, the ledger is one
engine call per claim, chart cells end with the chart, the code passes ruff, and the wrong facts
of the earlier version (issue 10) are gone."""
from __future__ import annotations

import ast
import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_utils import lora, training
from course_utils.claims import CLAIMS

ROOT = Path(__file__).resolve().parents[1]
LESSON = ROOT / "notebooks" / "03_combined_stack.ipynb"
SOLUTION = ROOT / "solutions" / "03_combined_stack.ipynb"
EXERCISE = ROOT / "exercises" / "03_combined_stack.ipynb"


@pytest.fixture(scope="module")
def lesson():
    return nbformat.read(LESSON, 4)


def cell(nb, cell_id):
    found = [c for c in nb.cells if c.get("id") == cell_id]
    assert len(found) == 1, f"expected one cell {cell_id!r}, found {len(found)}"
    return found[0]


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def test_the_production_step_cell_is_the_library_train_step(lesson):
    """The step the learner reads is textually course_utils.training.train_step."""
    assert cell(lesson, "train-step").source.strip() == inspect.getsource(training.train_step).strip()


def test_the_ladder_and_the_race_run_the_cells_step(lesson):
    for cell_id in ("ladder", "race"):
        assert "step_fn=train_step" in cell(lesson, cell_id).source, cell_id
    # no other definition of train_step could shadow the cell's
    defs = [c.id for c in code_cells(lesson) if re.search(r"^def train_step\b", c.source, re.MULTILINE)]
    assert defs == ["train-step"]


def test_the_lora_cell_is_the_library_adapter(lesson):
    want = inspect.getsource(lora.LoRALinear).strip() + "\n\n\n" + inspect.getsource(lora.add_lora).strip()
    assert cell(lesson, "lora-code").source.strip() == want
    assert "adapt=add_lora" in cell(lesson, "lora-measure").source


def test_the_ledger_is_one_engine_call_per_claim(lesson):
    """Each claim once, in order: lesson 03's own verdicts (``verdict``) and the other lessons'
    (``from_lesson``: the verdict that lesson recorded here, or measured again and labelled)."""
    src = cell(lesson, "ledger").source
    tree = ast.parse(src)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "id", None) in ("verdict", "from_lesson")]
    claims = [c.args[0].value for c in calls]
    assert claims == list(CLAIMS), "each claim C1-C20 once, in order"
    assert "claims.recorded_or_measure(" in src
    everywhere = "\n".join(c.source for c in code_cells(lesson))
    assert "Verdict(" not in everywhere, "verdicts come from claims.verdict, never built by hand"


def test_the_setup_cell_sets_the_threads_and_plans_from_the_recipe(lesson):
    src = cell(lesson, "setup").source
    assert "use_threads()" in src and "recommend_precision(hw)" in src


def test_chart_cells_end_with_the_chart(lesson):
    charts = [c for c in code_cells(lesson) if re.search(r"plots\.\w+_chart\(", c.source)]
    assert len(charts) >= 5
    for c in charts:
        last = ast.parse(c.source).body[-1]
        assert isinstance(last, ast.Expr) and isinstance(last.value, ast.Call), c.id
        assert last.value.func.attr.endswith("_chart"), c.id
        assert not c.source.rstrip().endswith(";"), c.id
        if last.value.func.attr not in ("scale_chart", "routes_chart"):   # estimates at scale: no profile
            assert any(k.arg == "size" for k in last.value.keywords), f"{c.id}: pass size="


def test_the_dashboard_cell_is_one_line(lesson):
    assert cell(lesson, "dashboard").source.strip() == "dashboard()"


def test_objectives_first_and_summary_last(lesson):
    assert "objective" in lesson.cells[0].source.lower()
    summary = cell(lesson, "summary").source
    assert "## Summary" in summary and "What to try next" in summary


def test_the_wrong_facts_are_gone(lesson):
    prose = "\n".join(c.source for c in lesson.cells if c.cell_type == "markdown")
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
    assert "print(result.reading())" in cell(lesson, "race").source
    assert "sel_time.describe(" in cell(lesson, "ladder-read").source
    assert "fp16 beside it on a GPU whose recipe is bf16" in cell(lesson, "s2").source


def test_sentences_name_configurations_in_words(lesson):
    """A learner reads "bf16 + full checkpointing, 2 micro-batches", never the short label
    "bf16+full+accum2": no f-string of the lesson prints a RunConfig's ``.label`` as it is."""
    for c in code_cells(lesson):
        for node in ast.walk(ast.parse(c.source)):
            if isinstance(node, ast.FormattedValue):
                v = node.value
                assert not (isinstance(v, ast.Attribute) and v.attr == "label"), \
                    f"{c.id}: {ast.unparse(v)} printed as it is: use plain_label()"
    assert "plain_label(" in cell(lesson, "ladder-read").source
    for cell_id in ("budget", "step-once"):
        assert "plain_label(" in cell(lesson, cell_id).source, cell_id


def test_no_emulated_precision_is_searched_or_raced(lesson):
    src = cell(lesson, "budget").source
    assert "candidates = [PLAIN, FULL, PLAIN.replace(checkpoint=\"selective\")]" in src
    assert 'PLAIN = base.replace(precision=RECIPE)' in cell(lesson, "ladder").source


@pytest.mark.parametrize("path", [LESSON, SOLUTION, EXERCISE], ids=["lesson", "solution", "exercise"])
def test_notebook_code_passes_ruff(path):
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.fail("ruff is not installed in this environment (pip install ruff)")
    out = subprocess.run([ruff, "check", "--line-length", "110", "--extend-select", "E501", str(path)],
                         capture_output=True, check=False,
                         text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


def test_exercise_grades_the_step_not_bookkeeping():
    """The step is one the lessons did not show (micro-batches of different lengths), graded
    against plain PyTorch (one big batch), with no course step to delegate to; Part B grades
    PyTorch's saved-tensor hooks, not the course's helpers."""
    nb = nbformat.read(SOLUTION, 4)
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
    assert len(quiz) == 3, "three auto-checked conceptual questions"
