"""Tests of the grader (course_grade) and of the graded notebooks in solutions/.

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
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbcells import cell
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

import course_grade as grading

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"
SOLUTION_NAMES = sorted(path.name for path in SOLUTIONS.glob("*.ipynb"))
LOSS_SCALING = "01_loss_scaling.ipynb"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")  # as tests/test_browser.py
# A class in the sandbox wherever bubblewrap is installed (CI installs it), else explicitly
# unsandboxed: without a sandbox the grader refuses a class (issue 27).
SANDBOX = ["--sandbox"] if shutil.which("bwrap") or IN_CI else ["--no-sandbox"]


def run_cli(*args: str) -> tuple[int, str]:
    """Run ``course-grade ARGS`` in-process; return the exit status and stdout."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = grading.main(list(args))
    return status, out.getvalue()


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
    # Sandboxed wherever bubblewrap is installed (CI installs it): the solutions must score full
    # marks in the sandbox instructors use, torchrun's ranks of exercise 04 included.
    status, out = run_cli("grade", str(folder), "--source", str(SOLUTIONS), "--csv", str(csv_path),
                          "--json", "--cell-timeout", "120", "--timeout", "300", *SANDBOX)
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


def tiny_source(folder: Path, name: str = "01_tiny.ipynb", answer: int = 42,
                prefix: str = "") -> Path:
    """A two-question source notebook without torch (3 points: ``answer()`` returns ``answer``,
    ``double(x)``); ``prefix`` keeps grade ids unique when a folder holds two of them."""
    return write_source(folder, name, [
        new_code_cell(f"def answer():\n    ### BEGIN SOLUTION\n    return {answer}\n"
                      "    ### END SOLUTION",
                      id="answer", metadata=nbgrader_meta("solution", f"{prefix}answer-solution")),
        new_code_cell(f"assert answer() == {answer}, "
                      f"f'answer() should be {answer}; yours is {{answer()}}'",
                      id="test-answer", metadata=nbgrader_meta("test", f"{prefix}answer", 1)),
        new_code_cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n"
                      "    ### END SOLUTION", id="double",
                      metadata=nbgrader_meta("solution", f"{prefix}d")),
        new_code_cell("assert double(3) == 6\n### BEGIN HIDDEN TESTS\nassert double(-1) == -2, "
                      "'double(-1) should be -2'\n### END HIDDEN TESTS",
                      id="test-double", metadata=nbgrader_meta("test", f"{prefix}double", 2)),
    ])


def tiny_course(tmp_path: Path, answer_body: str = "    return 42") -> tuple[Path, Path]:
    """A two-question source notebook without torch, and a submission whose first answer's body
    is ``answer_body``. Returns (source folder, submission path)."""
    source = tmp_path / "solutions"
    tiny_source(source)
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


def test_a_loop_that_ignores_interrupts_is_killed(tmp_path):
    body = "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n    while True:\n        pass"
    source, submission = tiny_course(tmp_path, body)
    started = time.monotonic()
    result = grading.grade_submission(submission, grading.load_sources(source), cell_timeout=2,
                                      timeout=60, probe_timeout=1.0)
    tests, seconds = {t.grade_id: t for t in result.tests}, time.monotonic() - started
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


def test_a_notebook_saved_without_cell_ids_is_matched_by_grade_id(tmp_path):
    source, submission = tiny_course(tmp_path)
    raw = json.loads(submission.read_text())
    raw["nbformat_minor"] = 4  # before cell ids
    for item in raw["cells"]:
        item.pop("id", None)
    submission.write_text(json.dumps(raw))
    result, _, _ = grade_one(source, submission, sandbox=False)
    assert result.graded and result.score == 3, result.error


def test_bad_time_limits_are_rejected(tmp_path):
    source, submission = tiny_course(tmp_path)
    with pytest.raises(ValueError, match="positive"):
        grading.grade([submission], source, cell_timeout=0)
    with pytest.raises(SystemExit):
        run_cli("grade", str(submission), "--timeout", "-3")


# --------------------------------------------------------------------------- attacks (issue 14)
# Each test below failed against the grader before course_grade (course_utils/grading.py at
# 0feb476), except those marked "held", which keep attacks it already withstood.

ESC = "\x1b"


def run_cli_process(*args: str, timeout: float = 240, **popen) -> subprocess.CompletedProcess:
    """``python -m course_grade ARGS`` in a child process whose stdout is strict UTF-8."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": "utf-8:strict",
           "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "course_grade", *args], env=env,
                          capture_output=True, timeout=timeout, **popen)


def write_raw(nb, path: Path) -> None:
    """Write ``nb`` as JSON without nbformat's validation (which repairs duplicate ids)."""
    path.write_text(json.dumps(nb, indent=1), encoding="utf-8")


def released_tiny(tmp_path: Path, source: Path, name: str = "01_tiny.ipynb"):
    grading.release(source, tmp_path / "released")
    return nbformat.read(tmp_path / "released" / name, 4)


class TestAttacks:
    """One test per attack of issue 14 (a class: pytest-xdist's loadscope runs it beside the
    class-folder tests above)."""

    def test_symlinks_garbage_and_oversized_files_are_refused_and_never_quoted(self, tmp_path):
        source, submission = tiny_course(tmp_path)
        folder = tmp_path / "class"
        (folder / "alice").mkdir(parents=True)
        (folder / "alice" / "01_tiny.ipynb").symlink_to(source / "01_tiny.ipynb")  # the reference
        (folder / "bob_01_tiny.ipynb").symlink_to("/etc/passwd")
        (folder / "carol").symlink_to(source, target_is_directory=True)  # a folder: not followed
        (folder / "text.ipynb").write_text("TOP-SECRET-TOKEN is not JSON")
        (folder / "binary.ipynb").write_bytes(b"\xff\xfe TOP-SECRET-TOKEN")
        (folder / "empty.ipynb").write_bytes(b"")
        (folder / "list.ipynb").write_text('["TOP-SECRET-TOKEN"]')
        v3_cell = {"cell_type": "code", "input": "TOP-SECRET-TOKEN", "outputs": [],
                   "language": "python"}
        v3 = {"nbformat": 3, "nbformat_minor": 0, "metadata": {},
              "worksheets": [{"cells": [v3_cell]}]}
        (folder / "v3.ipynb").write_text(json.dumps(v3))
        big = json.loads(submission.read_text())
        big["metadata"]["padding"] = "TOP-SECRET-TOKEN" * 70_000  # 1.1 MiB
        (folder / "big_01_tiny.ipynb").write_text(json.dumps(big))
        os.mkfifo(folder / "fifo_01_tiny.ipynb")  # reading it must not hang

        results = grading.grade([folder], source, sandbox=False, max_size=2**20)
        by_name = {Path(r.submission).relative_to(folder).as_posix(): r for r in results}
        errors = {name: r.error for name, r in by_name.items()}
        assert not any(r.graded for r in results), errors
        for name in ("alice/01_tiny.ipynb", "bob_01_tiny.ipynb", "carol"):
            assert "symbolic link" in errors[name]
        assert "not JSON" in errors["text.ipynb"] and "not UTF-8" in errors["binary.ipynb"]
        assert "not JSON" in errors["empty.ipynb"]
        assert "not a Jupyter notebook" in errors["list.ipynb"]
        assert "notebook format 3" in errors["v3.ipynb"]
        assert "too large" in errors["big_01_tiny.ipynb"]
        assert "not a regular file" in errors["fifo_01_tiny.ipynb"]
        passwd = Path("/etc/passwd").read_text().split(":")[0]
        for error in errors.values():
            assert "TOP-SECRET" not in error and f"{passwd}:" not in error

    def test_a_notebook_of_another_exercise_is_not_graded(self, tmp_path):
        source = tmp_path / "solutions"
        tiny_source(source)
        tiny_source(source, "02_other.ipynb", answer=7, prefix="other-")  # the same cell ids
        other = released_tiny(tmp_path, source, "02_other.ipynb")
        folder = tmp_path / "class"
        (folder / "renamed").mkdir(parents=True)
        nbformat.write(other, folder / "renamed" / "01_tiny.ipynb")
        other.metadata["course_grade"]["source"] = "01_tiny.ipynb"  # a claim as well as a name
        (folder / "claimed").mkdir()
        nbformat.write(other, folder / "claimed" / "01_tiny.ipynb")
        del other.metadata["course_grade"]
        nbformat.write(other, folder / "01_tiny_copy.ipynb")
        nbformat.write(released_tiny(tmp_path, source), folder / "01_tiny.ipynb")  # the right one

        results = {Path(r.submission).relative_to(folder).as_posix(): r
                   for r in grading.grade([folder], source, sandbox=False, timeout=60)}
        assert results["01_tiny.ipynb"].graded and results["01_tiny.ipynb"].max_score == 3
        renamed = results["renamed/01_tiny.ipynb"]  # its metadata says what it is: graded as such
        assert renamed.graded and renamed.source == "02_other.ipynb"
        for name in ("claimed/01_tiny.ipynb", "01_tiny_copy.ipynb"):
            assert not results[name].graded, name
            assert "looks like a different exercise" in results[name].error
            assert "02_other.ipynb" in results[name].error

    def test_exit_in_a_learner_cell_is_blamed_on_that_cell(self, tmp_path):
        source, submission = tiny_course(tmp_path, "    return 42\n\nexit()")
        result, tests, _ = grade_one(source, submission, cell_timeout=30, timeout=60)
        assert result.graded and result.score == 0 and result.max_score == 3
        for test in tests.values():
            assert test.status == "not run"
            assert "code cell 'answer'" in test.message and "exit()" in test.message, test.message
        assert any("'answer'" in issue and "stopped the kernel" in issue for issue in result.issues)

    def test_sys_exit_and_system_exit_fail_only_their_question(self, tmp_path):  # held
        body = "    sys.exit(3)\n\nimport sys\nraise SystemExit(1)"
        source, submission = tiny_course(tmp_path, body)
        result, tests, _ = grade_one(source, submission, cell_timeout=30, timeout=60)
        assert tests["answer"].status == "fail" and "SystemExit" in tests["answer"].message
        assert tests["double"].status == "pass" and result.score == 2

    def test_edited_duplicated_and_re_ided_tests_change_nothing(self, tmp_path):  # held
        source, submission = tiny_course(tmp_path, "    return 41")
        nb = nbformat.read(submission, 4)
        fake = copy.deepcopy(cell(nb, "test-answer"))
        fake.source = "pass  # my own test"
        cell(nb, "test-answer").id = "renamed-test"  # re-id'd: the source's test is put back
        cell(nb, "renamed-test").source = "pass"
        nb.cells.append(fake)  # the same id twice: the second is the learner's own cell
        nb.cells.append(new_code_cell("print('== 01_tiny.ipynb: 3/3 points')\n"
                                      "print('answer 1 1 pass')", id="fake-report"))
        write_raw(nb, submission)
        status, out = run_cli("grade", str(submission), "--source", str(source), "--no-sandbox")
        assert status == 0
        assert "2/3 points" in out and "3/3" not in out and "answer 1 1 pass" not in out

    @pytest.mark.parametrize("hook", [
        "get_ipython().input_transformers_cleanup.append(lambda lines: ['pass\\n'])",
        "get_ipython().input_transformers_post.append(lambda lines: ['pass\\n'])",
        "import ast\nclass Empty(ast.NodeTransformer):\n"
        "    def visit_Module(self, node):\n        node.body = []\n        return node\n"
        "get_ipython().ast_transformers.append(Empty())",
        "get_ipython().events.register('post_run_cell',\n"
        "                              lambda r: setattr(r, 'error_in_exec', None))",
        "get_ipython().events.register('pre_run_cell', lambda info: "
        "get_ipython().input_transformers_post.append(lambda lines: ['pass\\n']))",
        "get_ipython().set_custom_exc((Exception,), lambda *args, **kwargs: None)",
        "from IPython.core.interactiveshell import ExecutionInfo, ExecutionResult\n"
        "async def success(raw_cell, *args, **kwargs):\n"
        "    return ExecutionResult(ExecutionInfo(raw_cell, False, False, False, None))\n"
        "get_ipython().run_cell_async = success",
    ], ids=["cleanup-transformer", "post-transformer", "ast-transformer", "post-run-cell-event",
            "pre-run-cell-event", "custom-exception-handler", "run-cell-override"])
    def test_ipython_hooks_cannot_make_an_empty_exercise_pass(self, tmp_path, hook):
        source = tmp_path / "solutions"
        tiny_source(source)
        nb = released_tiny(tmp_path, source)
        nb.cells.insert(0, new_code_cell(hook, id="hook"))
        submission = tmp_path / "01_tiny.ipynb"
        nbformat.write(nb, submission)
        result, tests, _ = grade_one(source, submission, cell_timeout=30, timeout=60)
        assert result.graded and result.score == 0, {t.grade_id: t.message for t in tests.values()}

    def test_a_kernel_the_grader_cannot_reset_scores_nothing(self, tmp_path):
        source, submission = tiny_course(tmp_path)  # right answers, and a blocked reset
        nb = nbformat.read(submission, 4)
        hook = "get_ipython().user_expressions = lambda e: {}"
        nb.cells.insert(0, new_code_cell(hook, id="hook"))
        nbformat.write(nb, submission)
        result, tests, _ = grade_one(source, submission, cell_timeout=30, timeout=60)
        assert result.graded and result.score == 0
        assert all(t.status == "not run" and "changed how IPython runs code" in t.message
                   for t in tests.values())

    def test_learner_text_reaches_no_terminal_escape(self, tmp_path):
        body = "    raise ValueError('\\x1b[2J\\x1b]0;pwned\\x07cleared')"
        source, submission = tiny_course(tmp_path, body)
        nb = nbformat.read(submission, 4)
        nb.cells.append(new_code_cell("1 / 0  # \x1b[31mred\u202e", id="blink"))
        nb.cells[-1].id = "\x1b[5mblink"  # new_code_cell would refuse this id
        write_raw(nb, submission)
        named = submission.with_name("01_tiny \x1b[31mred\n.ipynb")
        submission.rename(named)
        status, out = run_cli("grade", str(named), "--source", str(source), "--no-sandbox")
        assert status == 0 and "2/3 points" in out  # answer fails, double passes
        assert ESC not in out and "\x07" not in out and "\u202e" not in out
        # escape sequences are gone, other control characters escaped
        assert "ValueError: cleared" in out and "# red\\u202e" in out
        result = grading.grade([named], source, sandbox=False)[0]
        texts = json.dumps(result.to_dict(), ensure_ascii=False)
        assert ESC not in texts and "\\n.ipynb" in result.submission

    def test_a_huge_print_costs_the_grader_no_memory(self, tmp_path):
        source, submission = tiny_course(tmp_path, "    return 42\n\nprint('x' * (32 << 20))")
        script = (
            "import json, resource, sys, course_grade\n"
            "import pandas, nbclient, jupyter_client, zmq\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            f"result = course_grade.grade([{str(submission)!r}], {str(source)!r},\n"
            "                            sandbox=False)[0]\n"
            "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "print(json.dumps([result.score, (after - before) / 1024]))\n"
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=120)
        score, growth_mib = json.loads(done.stdout.strip().splitlines()[-1])
        assert score == 3
        assert growth_mib < 16, f"the grader's peak memory grew by {growth_mib:.0f} MiB"

    def test_kernel_memory_is_capped_with_a_clear_note(self, tmp_path):
        source, submission = tiny_course(tmp_path, "    return 42\n\nhog = bytearray(8 << 30)")
        result, _, _ = grade_one(source, submission, cell_timeout=30, timeout=60, memory=1 << 30)
        assert result.score == 3  # the allocation fails in its own cell only
        assert any("code cell 'answer'" in issue and "MemoryError" in issue and "out of memory"
                   in issue and "1024 MiB" in issue for issue in result.issues), result.issues

    def test_a_folder_as_csv_is_refused_before_grading(self, tmp_path, capsys):
        source, submission = tiny_course(tmp_path)
        (tmp_path / "grades.csv").mkdir()
        status, out = run_cli("grade", str(submission), "--source", str(source),
                              "--csv", str(tmp_path / "grades.csv"), "--no-sandbox")
        assert status == 2 and "is a folder" in capsys.readouterr().err
        assert "==" not in out and not (tmp_path / "grades.jsonl").exists()  # nothing graded

    def test_a_hostile_class_folder_loses_no_graded_result(self, tmp_path):
        """A symlink, a non-UTF-8 name with an escape, learner text with escapes, and a learner
        that turns the CSV's path into a folder: every result still reaches the log and --json."""
        source, submission = tiny_course(tmp_path)
        csv_path = tmp_path / "out" / "grades.csv"
        folder = tmp_path / "class"
        folder.mkdir()
        shutil.copy(submission, folder / "a_good_01_tiny.ipynb")
        (folder / "b_link_01_tiny.ipynb").symlink_to(source / "01_tiny.ipynb")
        odd = os.fsdecode(b"c_caf\xe9\x1b[31m_01_tiny.ipynb")
        shutil.copy(submission, folder / odd)
        nb = nbformat.read(submission, 4)
        cell(nb, "answer").source = (f"import os\nos.makedirs({str(csv_path)!r}, exist_ok=True)\n"
                                     "def answer():\n    raise ValueError('\\x1b[2Jgone')")
        nbformat.write(nb, folder / "d_vandal_01_tiny.ipynb")

        process = run_cli_process("grade", str(folder), "--source", str(source), "--csv",
                                  str(csv_path), "--json", "--no-sandbox")
        assert process.returncode == 3, process.stderr
        results = {Path(r["submission"]).name: r for r in json.loads(process.stdout)}
        log = (tmp_path / "out" / "grades.jsonl").read_text().splitlines()
        printed = json.loads(process.stdout)
        # the log is in the order the submissions finished (-j: not the files' order)
        assert sorted(json.loads(line)["submission"] for line in log) == sorted(
            r["submission"] for r in printed)
        assert len(results) == 4
        assert results["a_good_01_tiny.ipynb"]["score"] == 3
        assert "symbolic link" in results["b_link_01_tiny.ipynb"]["error"]
        assert results["c_caf\\xe9\\x1b[31m_01_tiny.ipynb"]["score"] == 3
        assert results["d_vandal_01_tiny.ipynb"]["score"] == 2
        assert b"could not write the CSV" in process.stderr and b"grades.jsonl" in process.stderr
        assert b"\x1b" not in process.stdout + process.stderr
        assert b"\x1b" not in (tmp_path / "out" / "grades.jsonl").read_bytes()

    @pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
    def test_a_signal_stops_the_run_and_keeps_what_was_graded(self, tmp_path, signum):
        source, submission = tiny_course(tmp_path)
        folder = tmp_path / "class"
        folder.mkdir()
        shutil.copy(submission, folder / "a_01_tiny.ipynb")
        nb = nbformat.read(submission, 4)
        cell(nb, "answer").source = "import time\ntime.sleep(120)"
        nbformat.write(nb, folder / "b_01_tiny.ipynb")
        shutil.copy(submission, folder / "c_01_tiny.ipynb")
        csv_path = tmp_path / "grades.csv"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        process = subprocess.Popen(
            [sys.executable, "-m", "course_grade", "grade", str(folder), "--source", str(source),
             "--csv", str(csv_path), "-j", "1", *SANDBOX], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE)
        log = tmp_path / "grades.jsonl"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (log.exists() and log.read_text().count("\n")):
            time.sleep(0.2)
        time.sleep(3)  # b's kernel is asleep in its first cell
        process.send_signal(signum)
        out, err = process.communicate(timeout=60)
        assert process.returncode == 128 + signum, err
        with open(csv_path, newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert [Path(row["submission"]).name for row in rows] == ["a_01_tiny.ipynb"]
        assert rows[0]["score"] == "3"
        assert len(log.read_text().splitlines()) == 1
        assert f"stopped by {signal.Signals(signum).name}".encode() in err
        assert b"graded and kept: 1; not graded: 2 (from " in err
        assert b"b_01_tiny.ipynb" not in out.split(b"a_01_tiny.ipynb", 1)[0]
