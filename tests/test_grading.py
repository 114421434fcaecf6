"""Tests of the grader (course_utils.grading) and of the graded notebooks in solutions/.

Submissions are built in tmp_path from the solution notebooks. Notebook executions dominate the
run time (~3-5 s each): the class-folder fixture grades its folder once, and the timeout and
kernel-death tests use a tiny notebook without torch.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import io
import json
import shutil
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from course_utils import grading

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"
SOLUTION_NAMES = sorted(path.name for path in SOLUTIONS.glob("*.ipynb"))
LOSS_SCALING = "01_loss_scaling.ipynb"


def run_cli(*args: str) -> tuple[int, str]:
    """Run ``course-grade ARGS`` in-process; return the exit status and stdout."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = grading.main(list(args))
    return status, out.getvalue()


def cell(nb, cell_id):
    return next(c for c in nb.cells if c.get("id") == cell_id)


def replace_in_cell(nb, cell_id, old, new):
    target = cell(nb, cell_id)
    assert old in target.source, f"test out of date: {old!r} is no longer in cell {cell_id!r}"
    target.source = target.source.replace(old, new)


def nbgrader_meta(kind, grade_id, points=None):
    meta = {"grade": kind == "test", "grade_id": grade_id, "locked": kind == "test",
            "solution": kind == "solution"}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


# --------------------------------------------------------------------------- format and release


def test_clear_solutions_keeps_the_region_indentation():
    source = (
        "class A:\n"
        "    def f(self):\n"
        "        ### BEGIN SOLUTION\n"
        "        return 1\n"
        "        ### END SOLUTION\n"
        "\n"
        "x = 1"
    )
    assert grading.clear_solutions(source) == (
        "class A:\n"
        "    def f(self):\n"
        "        # YOUR CODE HERE\n"
        "        raise NotImplementedError()\n"
        "\n"
        "x = 1"
    )
    assert grading.clear_solutions("### BEGIN SOLUTION\nx = 1\n### END SOLUTION") == (
        "# YOUR CODE HERE\nraise NotImplementedError()"
    )
    assert grading.clear_solutions("### BEGIN SOLUTION\n42\n### END SOLUTION", markdown=True) == (
        "YOUR ANSWER HERE"
    )


def test_remove_hidden_tests():
    source = "assert f(1) == 1\n### BEGIN HIDDEN TESTS\nassert f(2) == 2\n### END HIDDEN TESTS"
    assert grading.remove_hidden_tests(source) == "assert f(1) == 1"


@pytest.mark.parametrize(
    "source, problem",
    [
        ("### BEGIN SOLUTION\nx = 1", "never closed"),
        ("x = 1\n### END SOLUTION", "without"),
        ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "inside the region"),
    ],
)
def test_unbalanced_markers_are_errors(source, problem):
    with pytest.raises(grading.GradingError, match=problem):
        grading.clear_solutions(source, where="nb.ipynb, cell 3")


def write_source(folder: Path, name: str, cells) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    nbformat.write(new_notebook(cells=cells), path)
    return path


@pytest.mark.parametrize(
    "cells, problem",
    [
        ([new_code_cell("x = 1", id="a")], "no test cells"),
        ([new_code_cell("pass", id="t", metadata=nbgrader_meta("test", None, 1))], "grade_id"),
        ([new_code_cell("pass", id="t", metadata=nbgrader_meta("test", "t", -1))], "points"),
        ([new_code_cell("pass", id="t", metadata=nbgrader_meta("test", "t", "2"))], "points"),
        (
            [new_code_cell("pass", id="t", metadata=nbgrader_meta("test", "t", 1)),
             new_code_cell("pass", id="u", metadata=nbgrader_meta("test", "t", 1))],
            "used twice",
        ),
        (
            [new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION", id="t",
                           metadata=nbgrader_meta("test", "t", 1))],
            "cannot hold a solution",
        ),
    ],
)
def test_malformed_sources_are_clear_errors(tmp_path, cells, problem):
    path = write_source(tmp_path, "01_bad.ipynb", cells)
    with pytest.raises(grading.GradingError, match=problem):
        grading.load_source(path)


@pytest.mark.parametrize("second_id, problem", [("a", "used twice"), (None, "no cell id")])
def test_sources_need_unique_cell_ids(tmp_path, second_id, problem):
    # nbformat's reader repairs ids silently (with random ones): the grader must refuse instead.
    nb = new_notebook(cells=[new_code_cell("pass", id="a"),
                             new_code_cell("pass", id="t", metadata=nbgrader_meta("test", "t", 1))])
    raw = json.loads(nbformat.writes(nb))
    raw["cells"][1]["id"] = second_id
    if second_id is None:
        del raw["cells"][1]["id"]
    (tmp_path / "01_bad.ipynb").write_text(json.dumps(raw))
    with pytest.raises(grading.GradingError, match=problem):
        grading.load_source(tmp_path / "01_bad.ipynb")


def test_missing_source_folder_is_a_clear_error(tmp_path):
    with pytest.raises(grading.GradingError, match="does not exist"):
        grading.load_sources(tmp_path / "nowhere")
    status, _ = run_cli("release", "--source", str(tmp_path / "nowhere"), "--dest", str(tmp_path))
    assert status == 2


def test_release_clears_outputs_and_keeps_ids(tmp_path):
    solution = new_code_cell(
        "def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION",
        id="solution-cell", metadata={**nbgrader_meta("solution", "f"), "ExecuteTime": {}},
        execution_count=3,
        outputs=[nbformat.v4.new_output("stream", name="stdout", text="hi\n")],
    )
    test = new_code_cell(
        "assert f() == 1\n### BEGIN HIDDEN TESTS\nassert f() + 1 == 2\n### END HIDDEN TESTS",
        id="test-cell", metadata=nbgrader_meta("test", "f_returns_1", 1), execution_count=4,
    )
    path = write_source(tmp_path / "src", "01_f.ipynb", [new_markdown_cell("# F", id="md"),
                                                          solution, test])
    assert grading.release(tmp_path / "src", tmp_path / "ex") == [tmp_path / "ex" / "01_f.ipynb"]
    released = nbformat.read(tmp_path / "ex" / "01_f.ipynb", 4)
    assert [c.id for c in released.cells] == ["md", "solution-cell", "test-cell"]
    assert cell(released, "solution-cell").source == (
        "def f():\n    # YOUR CODE HERE\n    raise NotImplementedError()"
    )
    assert cell(released, "test-cell").source == "assert f() == 1"
    assert all(c.outputs == [] and c.execution_count is None
               for c in released.cells if c.cell_type == "code")
    assert "ExecuteTime" not in cell(released, "solution-cell").metadata
    assert cell(released, "test-cell").metadata["editable"] is False
    assert released.metadata["course_grade"] == {"source": "01_f.ipynb"}
    # the source itself is untouched, and a second release writes nothing
    assert "### BEGIN SOLUTION" in nbformat.read(path, 4).cells[1].source
    assert grading.release(tmp_path / "src", tmp_path / "ex") == []


def test_release_check_detects_stale_exercises(tmp_path):
    source, dest = tmp_path / "solutions", tmp_path / "exercises"
    shutil.copytree(SOLUTIONS, source)
    assert run_cli("release", "--source", str(source), "--dest", str(dest))[0] == 0
    assert run_cli("release", "--check", "--source", str(source), "--dest", str(dest))[0] == 0
    nb = nbformat.read(source / LOSS_SCALING, 4)
    replace_in_cell(nb, "q1-test", "# Test:", "# Test (changed):")
    nbformat.write(nb, source / LOSS_SCALING)
    status, out = run_cli("release", "--check", "--source", str(source), "--dest", str(dest))
    assert status == 1 and "out of date" in out
    (dest / "99_orphan.ipynb").write_text("{}")
    status, out = run_cli("release", "--check", "--source", str(source), "--dest", str(dest))
    assert status == 1 and "99_orphan.ipynb has no source" in out


def test_exercises_are_up_to_date_with_solutions():
    problems = grading.check_release(SOLUTIONS, EXERCISES)
    assert not problems, "; ".join(problems) + ": run `course-grade release`"


@pytest.mark.parametrize("folder", [SOLUTIONS, EXERCISES], ids=["solutions", "exercises"])
def test_graded_notebooks_are_stripped(folder):
    # What `nbstripout --keep-id` removes (CI runs `nbstripout --verify` itself).
    for path in sorted(folder.glob("*.ipynb")):
        nb = nbformat.read(path, 4)
        dirty = [c.id for c in nb.cells if c.cell_type == "code" and (c.outputs or c.execution_count)]
        dirty += [c.id for c in nb.cells
                  if set(c.metadata) & {"collapsed", "ExecuteTime", "execution", "scrolled"}]
        assert not dirty, f"{path}: run `nbstripout --keep-id` (cells {dirty})"


def test_solutions_are_valid_sources():
    sources = grading.load_sources(SOLUTIONS)
    assert sorted(sources) == SOLUTION_NAMES
    assert all(source.max_points > 0 for source in sources.values())


# --------------------------------------------------------------------------- a class folder


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    """Grade a folder of mixed submissions once: (exit status, {name: result}, csv rows)."""
    folder = tmp_path_factory.mktemp("class")
    for name in SOLUTION_NAMES:
        stem = Path(name).stem
        (folder / f"solution_{stem}").mkdir()
        shutil.copy(SOLUTIONS / name, folder / f"solution_{stem}" / name)
        (folder / f"untouched_{stem}").mkdir()
        # renamed by the learner: matched by the metadata written at release
        shutil.copy(EXERCISES / name, folder / f"untouched_{stem}" / "my homework.ipynb")

    def submit(label, nb):
        (folder / label).mkdir()
        nbformat.write(nb, folder / label / LOSS_SCALING)

    base = nbformat.read(SOLUTIONS / LOSS_SCALING, 4)

    wrong = copy.deepcopy(base)
    replace_in_cell(wrong, "q2-solution", "    return scale\n", "    return 2 * scale\n")
    submit("wrong_answer", wrong)

    edited = copy.deepcopy(base)
    replace_in_cell(edited, "q1-solution", "    return lost.sum().item() / nonzero.sum().item()",
                    "    return 0.5")
    cell(edited, "q1-test").source = "# my code is right, trust me\npass"
    cell(edited, "q1-test").metadata["nbgrader"]["points"] = 100
    submit("edited_test", edited)

    shuffled = copy.deepcopy(base)
    shuffled.cells = [c for c in shuffled.cells if c.id not in ("q3-test-update", "summary")]
    moved = cell(shuffled, "q1-test")
    shuffled.cells.remove(moved)
    shuffled.cells.insert(0, moved)
    submit("deleted_and_moved", shuffled)

    (folder / "notes.txt").write_text("not a notebook")
    (folder / "broken.ipynb").write_text('{"cells": [')
    nbformat.write(new_notebook(cells=[new_code_cell("1 + 1")]), folder / "unrelated.ipynb")

    csv_path = folder.parent / f"{folder.name}.csv"
    status, out = run_cli("grade", str(folder), "--source", str(SOLUTIONS), "--csv", str(csv_path),
                          "--json", "--cell-timeout", "120", "--timeout", "300")
    results = {str(Path(r["submission"]).relative_to(folder)): r for r in json.loads(out)}
    with open(csv_path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    return status, results, rows


def by_grade_id(result):
    return {test["grade_id"]: test for test in result["tests"]}


@pytest.mark.parametrize("name", SOLUTION_NAMES)
def test_each_solution_scores_full_marks(graded_class, name):
    result = graded_class[1][f"solution_{Path(name).stem}/{name}"]
    failed = {t["grade_id"]: t["message"] for t in result["tests"] if t["status"] != "pass"}
    assert not failed
    assert result["score"] == result["max_score"] > 0
    assert result["issues"] == []


@pytest.mark.parametrize("name", SOLUTION_NAMES)
def test_each_untouched_exercise_scores_zero(graded_class, name):
    result = graded_class[1][f"untouched_{Path(name).stem}/my homework.ipynb"]
    assert result["graded"] and result["source"] == name
    assert result["score"] == 0 and result["max_score"] > 0
    assert all(t["status"] == "fail" and "NotImplementedError" in t["message"]
               for t in result["tests"])


def test_one_wrong_answer_loses_exactly_its_points(graded_class):
    result = graded_class[1][f"wrong_answer/{LOSS_SCALING}"]
    tests = by_grade_id(result)
    assert tests["smallest_saving_scale"]["status"] == "fail"
    assert tests["smallest_saving_scale"]["message"].startswith(
        "AssertionError: smallest_saving_scale(example) should return 2^5 = 32.0, yours returned 64.0"
    )
    assert result["score"] == result["max_score"] - tests["smallest_saving_scale"]["max_points"]


def test_an_edited_visible_test_still_fails(graded_class):
    result = graded_class[1][f"edited_test/{LOSS_SCALING}"]
    tests = by_grade_id(result)
    assert tests["underflow_fraction"]["status"] == "fail"
    assert tests["underflow_fraction"]["max_points"] == 2  # the source's points, not the learner's
    assert result["score"] == result["max_score"] - 2
    assert any("edited" in issue and "underflow_fraction" in issue for issue in result["issues"])


def test_deleted_and_moved_cells_are_restored_and_reported(graded_class):
    result = graded_class[1][f"deleted_and_moved/{LOSS_SCALING}"]
    assert result["score"] == result["max_score"]
    issues = " ".join(result["issues"])
    assert "deleted" in issues and "skip_backoff_grow" in issues
    assert "moved" in issues and "underflow_fraction" in issues


def test_ungradable_files_are_reported_and_grading_goes_on(graded_class):
    status, results, _ = graded_class
    assert status == 1  # not every submission could be graded
    assert "not a notebook" in results["notes.txt"]["error"]
    assert "not a readable notebook" in results["broken.ipynb"]["error"]
    assert "cannot tell which graded notebook" in results["unrelated.ipynb"]["error"]


def test_csv_has_one_row_per_submission(graded_class):
    _, results, rows = graded_class
    assert len(rows) == len(results) == 2 * len(SOLUTION_NAMES) + 6
    by_file = {row["submission"]: row for row in rows}
    for submission, result in results.items():
        row = next(r for path, r in by_file.items() if path.endswith(submission))
        assert row["graded"] == str(result["graded"])
        assert float(row["score"]) == result["score"]
    assert "smallest_saving_scale" in rows[0]


# --------------------------------------------------------------------------- time limits, crashes


def tiny_course(tmp_path: Path, answer_body: str = "    return 42") -> tuple[Path, Path]:
    """A two-question source notebook without torch, and a submission whose first answer's body
    is ``answer_body``. Returns (source folder, submission path)."""
    source = tmp_path / "solutions"
    write_source(source, "01_tiny.ipynb", [
        new_code_cell("def answer():\n    ### BEGIN SOLUTION\n    return 42\n    ### END SOLUTION",
                      id="answer", metadata=nbgrader_meta("solution", "answer")),
        new_code_cell("assert answer() == 42, f'answer() should be 42; yours is {answer()}'",
                      id="test-answer", metadata=nbgrader_meta("test", "answer", 1)),
        new_code_cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n"
                      "    ### END SOLUTION", id="double", metadata=nbgrader_meta("solution", "d")),
        new_code_cell("assert double(3) == 6\n### BEGIN HIDDEN TESTS\nassert double(-1) == -2, "
                      "'double(-1) should be -2'\n### END HIDDEN TESTS",
                      id="test-double", metadata=nbgrader_meta("test", "double", 2)),
    ])
    grading.release(source, tmp_path / "exercises")
    nb = nbformat.read(tmp_path / "exercises" / "01_tiny.ipynb", 4)
    cell(nb, "answer").source = "import os, signal, time\n\ndef answer():\n" + answer_body
    cell(nb, "double").source = "def double(x):\n    return 2 * x"
    submission = tmp_path / "submissions" / "01_tiny.ipynb"
    submission.parent.mkdir()
    nbformat.write(nb, submission)
    return source, submission


def grade_one(source, submission, **limits):
    started = time.monotonic()
    result = grading.grade([submission], source, **limits)[0]
    return result, {t.grade_id: t for t in result.tests}, time.monotonic() - started


def test_tiny_submission_exit_status_kernel_and_hidden_tests(tmp_path, monkeypatch):
    # The kernel runs this Python, with COURSE_SIZE=smoke unless the caller set it.
    monkeypatch.delenv("COURSE_SIZE", raising=False)
    body = (f"    import sys\n    assert sys.executable == {sys.executable!r}, sys.executable\n"
            "    assert os.environ['COURSE_SIZE'] == 'smoke'\n    return 42")
    source, submission = tiny_course(tmp_path, body)
    status, out = run_cli("grade", str(submission), "--source", str(source))
    assert status == 0
    assert "3/3 points" in out, out
    nb = nbformat.read(submission, 4)
    cell(nb, "double").source = "def double(x):\n    return 2 * x if x > 0 else 0"
    nbformat.write(nb, submission)
    _, tests, _ = grade_one(source, submission)
    assert tests["double"].status == "fail"
    assert tests["double"].message == "AssertionError: double(-1) should be -2"


def test_an_infinite_loop_is_stopped_and_later_questions_still_score(tmp_path):
    source, submission = tiny_course(tmp_path, "    while True:\n        pass")
    result, tests, seconds = grade_one(source, submission, cell_timeout=2, timeout=60)
    assert result.graded
    assert tests["answer"].status == "fail" and "timed out after 2 s" in tests["answer"].message
    assert tests["double"].status == "pass"
    assert result.score == 2 and seconds < 30


def test_a_loop_that_ignores_interrupts_is_killed(tmp_path, monkeypatch):
    monkeypatch.setattr(grading, "_PROBE_TIMEOUT", 1.0)
    body = "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n    while True:\n        pass"
    source, submission = tiny_course(tmp_path, body)
    result, tests, seconds = grade_one(source, submission, cell_timeout=2, timeout=60)
    assert tests["answer"].status == "fail"
    assert tests["double"].status == "not run" and "did not stop" in tests["double"].message
    assert result.score == 0 and seconds < 30


def test_the_notebook_time_limit_stops_a_submission(tmp_path):
    source, submission = tiny_course(tmp_path, "    return 42\n\ntime.sleep(60)")
    result, tests, seconds = grade_one(source, submission, cell_timeout=50, timeout=6)
    assert result.graded and result.score == 0
    assert all(t.status == "not run" and "time limit" in t.message for t in tests.values())
    assert any("notebook limit" in issue for issue in result.issues)
    assert seconds < 30


def test_a_dead_kernel_is_reported(tmp_path):
    source, submission = tiny_course(tmp_path, "    return 42\n\nos._exit(3)")
    result, tests, _ = grade_one(source, submission, cell_timeout=30, timeout=60)
    assert result.graded and result.score == 0
    assert any("kernel died" in issue for issue in result.issues)
    assert all(t.status == "not run" for t in tests.values())


def test_bad_time_limits_are_rejected(tmp_path):
    source, submission = tiny_course(tmp_path)
    with pytest.raises(ValueError, match="positive"):
        grading.grade([submission], source, cell_timeout=0)
    with pytest.raises(SystemExit):
        run_cli("grade", str(submission), "--timeout", "-3")
