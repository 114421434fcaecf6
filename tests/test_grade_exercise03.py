"""Exercise 03 grades the subject: two broken versions of the production step, graded with the
course's grader, lose exactly the points of the check that catches their mistake, and a step that
delegates to the library's `train_step` fails.

(Full marks for the solution and 0 for the untouched exercise are `test_grading`'s, for every
graded notebook.) Each submission is one execution of the notebook at ``smoke`` size.
"""
from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

import nbformat
import pytest

import course_grade as grading

ROOT = Path(__file__).resolve().parents[1]
NAME = "03_combined_stack.ipynb"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")  # as tests/test_browser.py
#: Submissions outside the course folder: in the sandbox where bubblewrap is installed (CI
#: installs it), else explicitly unsandboxed (the default refuses them without a sandbox).
SANDBOX = True if shutil.which("bwrap") or IN_CI else False

#: (submission, cell id, what the solution says, what the broken version says, the test it fails)
BROKEN = {
    "no_unscale": ("q2-solution", "    scaler.unscale_(optimizer)\n", "", "ex03_step_scaler"),
    "scaler_on_bf16": ("q1-solution", 'enabled=precision == "fp16"',
                       'enabled=precision in ("fp16", "bf16")', "ex03_make_scaler"),
}

#: A step that hands the work to the course's own step (importable from the library).
DELEGATE = ("    from course_utils.training import train_step\n"
            "    return train_step(model, optimizer, scaler, micro_batches, dtype, max_grad_norm)\n")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """{submission name: SubmissionResult} for the broken versions of the solution."""
    folder = tmp_path_factory.mktemp("ex03")
    solution = nbformat.read(ROOT / "solutions" / NAME, 4)
    for name, (cell_id, old, new, _) in BROKEN.items():
        nb = copy.deepcopy(solution)
        cell = next(c for c in nb.cells if c.get("id") == cell_id)
        assert old in cell.source, f"test out of date: {old!r} is no longer in cell {cell_id!r}"
        cell.source = cell.source.replace(old, new)
        (folder / name).mkdir()
        nbformat.write(nb, folder / name / NAME)
    nb = copy.deepcopy(solution)
    cell = next(c for c in nb.cells if c.get("id") == "q2-solution")
    head, rest = cell.source.split("### BEGIN SOLUTION\n")
    cell.source = head + "### BEGIN SOLUTION\n" + DELEGATE + "    ### END SOLUTION" + \
        rest.split("### END SOLUTION")[1]
    (folder / "delegates").mkdir()
    nbformat.write(nb, folder / "delegates" / NAME)
    sources = grading.load_sources(ROOT / "solutions")
    return {name: grading.grade_submission(folder / name / NAME, {NAME: sources[NAME]},
                                           cell_timeout=120, timeout=300, sandbox=SANDBOX)
            for name in [*BROKEN, "delegates"]}


def test_a_step_that_delegates_to_the_library_fails(graded):
    """`train_step` divides by the number of micro-batches and gets a plain model: it fails the
    checks of the gradients (micro-batches of different lengths) and of checkpointing."""
    result = graded["delegates"]
    assert result.error is None, result.error
    tests = {t.grade_id: t for t in result.tests}
    for failing in ("ex03_step_fp32", "ex03_step_low_precision", "ex03_step_scaler",
                    "ex03_step_checkpoint"):
        assert tests[failing].status == "fail", f"delegating should fail {failing}: {tests[failing]}"
    assert "big batch" in tests["ex03_step_fp32"].message
    lost = sum(tests[g].max_points for g in ("ex03_step_fp32", "ex03_step_low_precision",
                                              "ex03_step_scaler", "ex03_step_checkpoint"))
    assert result.score <= sum(t.max_points for t in result.tests) - lost


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_step_loses_exactly_its_points(graded, name):
    result = graded[name]
    assert result.error is None, result.error
    failing = BROKEN[name][3]
    tests = {t.grade_id: t for t in result.tests}
    assert tests[failing].status == "fail", f"{name} should fail {failing}: {tests[failing]}"
    others = {g: t.status for g, t in tests.items() if g != failing}
    assert set(others.values()) == {"pass"}, f"{name} should fail only {failing}: {others}"
    max_score = sum(t.max_points for t in result.tests)
    assert result.score == max_score - tests[failing].max_points


def test_the_failure_messages_teach(graded):
    scaler = {t.grade_id: t for t in graded["no_unscale"].tests}["ex03_step_scaler"]
    assert "unscale_(optimizer) before clip_grad_norm_" in scaler.message
    bf16 = {t.grade_id: t for t in graded["scaler_on_bf16"].tests}["ex03_make_scaler"]
    assert "bf16" in bf16.message and "needs none" in bf16.message
