"""The instructor's side at class scale (issue 19): parallel grading (-j), feedback pages that
leak no hidden test or solution, the roster gradebook and LMS exports, clear refusals.

Most tests use a tiny source notebook without torch (a kernel start each, ~2-4 s); the test of
two exercise-04 gradings at once runs the real exercise twice, side by side (torchrun in each).
"""

from __future__ import annotations

import contextlib
import copy
import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

import course_grade as grading
from course_grade.feedback import feedback_html, feedback_markdown, question_texts, safe_message
from course_grade.results import SubmissionResult, TestResult

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")  # as tests/test_browser.py
REGION = re.compile(r"### BEGIN (SOLUTION|HIDDEN TESTS)\n(.*?)### END \1", re.S)


def run_cli(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = grading.main(list(args))
    return status, out.getvalue()


def meta(kind, grade_id, points=None):
    data = {"grade": kind == "test", "grade_id": grade_id, "locked": kind in ("test", "locked"),
            "solution": kind == "solution"}
    if points is not None:
        data["points"] = points
    return {"nbgrader": data}


def tiny_course(tmp_path: Path) -> Path:
    """A source without torch: two questions (3 points), a hidden check with a bare assert."""
    source = tmp_path / "solutions"
    source.mkdir()
    cells = [
        new_markdown_cell("# Tiny\n\n### Question 1 (1 point): the answer\n\nReturn 42.",
                          id="q1-md"),
        new_code_cell("def answer():\n    ### BEGIN SOLUTION\n    return 42\n    ### END SOLUTION",
                      id="answer", metadata=meta("solution", "answer-solution")),
        new_code_cell("# Test: answer() (1 point)\nassert answer() == 42, "
                      "f'answer() should be 42; yours is {answer()}'",
                      id="test-answer", metadata=meta("test", "answer", 1)),
        new_markdown_cell("### Question 2 (2 points): double\n\nWrite `double(x)`.", id="q2-md"),
        new_code_cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x  # SOLUTION-MARK\n"
                      "    ### END SOLUTION", id="double", metadata=meta("solution", "d")),
        new_code_cell("# Test: double (2 points)\nassert double(3) == 6\n"
                      "### BEGIN HIDDEN TESTS\nassert double(-7) == -14  # HIDDEN-MARK\n"
                      "### END HIDDEN TESTS",
                      id="test-double", metadata=meta("test", "double", 2)),
    ]
    nbformat.write(new_notebook(cells=cells), source / "01_tiny.ipynb")
    grading.release(source, tmp_path / "exercises")
    return source


def submission(tmp_path: Path, answer="return 42", double="return 2 * x") -> nbformat.NotebookNode:
    nb = nbformat.read(tmp_path / "exercises" / "01_tiny.ipynb", 4)
    for c in nb.cells:
        if c.id == "answer":
            c.source = f"def answer():\n    {answer}"
        if c.id == "double":
            c.source = f"def double(x):\n    {double}"
    return nb


def write(nb, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


# --------------------------------------------------------------------------- refusals


def test_tampered_tests_are_graded_with_the_sources_tests_and_a_note(tmp_path):
    source = tiny_course(tmp_path)
    nb = submission(tmp_path, answer="return 41")
    for c in nb.cells:  # every test changed: the learner's copy would pass
        if c.id in ("test-answer", "test-double"):
            c.source = "pass  # trust me"
    path = write(nb, tmp_path / "class" / "01_tiny.ipynb")
    result = grading.grade([path], source, sandbox=False, timeout=60)[0]
    assert result.graded, result.error  # not "a different exercise"
    tests = {t.grade_id: t for t in result.tests}
    assert tests["answer"].status == "fail" and "yours is 41" in tests["answer"].message
    assert tests["double"].status == "pass" and result.score == 2
    note = next(i for i in result.issues if "restored" in i)
    assert "2 of the 2 test and read-only cells differ" in note
    assert "test 'answer' (edited" in note and "test 'double' (edited" in note


def test_only_a_better_matching_exercise_is_called_different(tmp_path):
    source = tiny_course(tmp_path)
    other = copy.deepcopy(nbformat.read(source / "01_tiny.ipynb", 4))
    for c in other.cells:  # another exercise: its own tests, the same cell ids
        if c.get("metadata", {}).get("nbgrader", {}).get("grade_id"):
            c.metadata["nbgrader"]["grade_id"] = "other-" + c.metadata["nbgrader"]["grade_id"]
        c.source = c.source.replace("42", "7")
    nbformat.write(other, source / "02_other.ipynb")
    grading.release(source, tmp_path / "exercises")
    folder = tmp_path / "class"
    theirs = nbformat.read(tmp_path / "exercises" / "02_other.ipynb", 4)
    del theirs.metadata["course_grade"]
    write(theirs, folder / "a_01_tiny.ipynb")  # 02 handed in under 01's name
    lesson = new_notebook(cells=[new_markdown_cell("# Tiny", id="q1-md"),
                                 new_code_cell("x = 1", id="mine")])
    write(lesson, folder / "b_01_tiny.ipynb")  # one of four cells: not this exercise
    results = {Path(r.submission).name: r
               for r in grading.grade([folder], source, sandbox=False, timeout=60)}
    assert "looks like a different exercise" in results["a_01_tiny.ipynb"].error
    assert "02_other.ipynb" in results["a_01_tiny.ipynb"].error
    assert "does not look like 01_tiny.ipynb: it has 1 of its 6 cells" in (
        results["b_01_tiny.ipynb"].error)


# --------------------------------------------------------------------------- -j N


def tiny_class(tmp_path: Path, n: int = 4) -> tuple[Path, Path]:
    source = tiny_course(tmp_path)
    folder = tmp_path / "class"
    for i in range(n):  # alternating right and wrong answers: distinct scores
        nb = submission(tmp_path, answer="return 42" if i % 2 == 0 else "return 0")
        write(nb, folder / f"learner{i}" / "01_tiny.ipynb")
    return source, folder


def test_two_jobs_give_the_same_results_in_the_same_order(tmp_path):
    source, folder = tiny_class(tmp_path)
    one = grading.grade([folder], source, sandbox=False, timeout=60, jobs=1)
    finished = []
    two = grading.grade([folder], source, sandbox=False, timeout=60, jobs=2,
                        progress=finished.append)
    key = [(r.submission, r.score, [t.status for t in r.tests]) for r in one]
    assert key == [(r.submission, r.score, [t.status for t in r.tests]) for r in two]
    assert [r.submission for r in one] == sorted(r.submission for r in one)
    assert sorted(r.submission for r in finished) == sorted(r.submission for r in two)
    assert [r.score for r in one] == [3, 2, 3, 2]


def test_jobs_divide_the_thread_budget(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    assert grading.threads_per_job(1) == 8 and grading.threads_per_job(3) == 2
    assert grading.threads_per_job(16) == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert grading.threads_per_job(1) == cores
    assert 1 <= grading.default_jobs() <= cores and grading.default_jobs(1) == 1
    with pytest.raises(ValueError, match="positive integer"):
        grading.grade(["x"], "solutions", jobs=0)


def test_each_kernel_gets_its_share_of_threads_and_its_own_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    source = tiny_course(tmp_path)
    nb = submission(tmp_path, answer=(
        "import os, tempfile; return 42 if os.environ['OMP_NUM_THREADS'] == '2' and "
        "tempfile.gettempdir().startswith(os.environ['HOME'].rsplit('/', 1)[0]) else 0"))
    folder = tmp_path / "class"
    write(nb, folder / "a" / "01_tiny.ipynb")
    write(nb, folder / "b" / "01_tiny.ipynb")
    results = grading.grade([folder], source, sandbox=False, timeout=60, jobs=2)
    assert [r.score for r in results] == [3, 3], [r.tests for r in results]


def test_the_cli_prints_tables_in_the_files_order_with_j(tmp_path, capsys):
    source, folder = tiny_class(tmp_path)
    csv_path = tmp_path / "grades.csv"
    status, out = run_cli("grade", str(folder), "--source", str(source), "-j", "2",
                          "--csv", str(csv_path), "--no-sandbox")
    assert status == 0
    order = [out.index(f"learner{i}/01_tiny.ipynb (01_tiny.ipynb)") for i in range(4)]
    assert order == sorted(order)
    err = capsys.readouterr().err
    assert "4 files, 2 at a time" in err and err.count("[") >= 4
    with open(csv_path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [Path(r["submission"]).parent.name for r in rows] == [f"learner{i}" for i in range(4)]
    assert len((tmp_path / "grades.jsonl").read_text().splitlines()) == 4


def test_ctrl_c_with_two_jobs_keeps_what_finished(tmp_path):
    source = tiny_course(tmp_path)
    folder = tmp_path / "class"
    write(submission(tmp_path), folder / "a_01_tiny.ipynb")
    write(submission(tmp_path, answer="import time; time.sleep(120)"), folder / "b_01_tiny.ipynb")
    write(submission(tmp_path), folder / "c_01_tiny.ipynb")
    write(submission(tmp_path, answer="import time; time.sleep(120)"), folder / "d_01_tiny.ipynb")
    csv_path = tmp_path / "grades.csv"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "course_grade", "grade", str(folder), "--source", str(source),
         "--csv", str(csv_path), "-j", "2", "--no-sandbox"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    log = tmp_path / "grades.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (log.exists() and log.read_text().count("\n") >= 2):
        time.sleep(0.2)
    time.sleep(2)  # b's and d's kernels are asleep
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    with open(csv_path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [Path(row["submission"]).name for row in rows] == ["a_01_tiny.ipynb", "c_01_tiny.ipynb"]
    assert b"graded and kept: 2; not graded: 2 (the first: " in err
    assert out.index(b"a_01_tiny.ipynb (01_tiny") < out.index(b"c_01_tiny.ipynb (01_tiny")


# --------------------------------------------------------------------------- feedback


def test_feedback_pages_say_what_the_learner_needs(tmp_path):
    source = tiny_course(tmp_path)
    nb = submission(tmp_path, answer="return 41", double="return 2 * x if x > 0 else 0")
    nb.cells = [c for c in nb.cells if c.id != "q2-md"]  # a deleted cell: a note
    folder = tmp_path / "class"
    write(nb, folder / "alice" / "01_tiny.ipynb")
    write(submission(tmp_path), folder / "bob" / "01_tiny.ipynb")
    (folder / "carol.txt").write_text("not a notebook")
    out_dir = tmp_path / "feedback"
    status, _ = run_cli("grade", str(folder), "--source", str(source), "--no-sandbox",
                        "--csv", str(tmp_path / "grades.csv"), "--feedback", str(out_dir))
    assert status == 1  # carol's file is not graded
    pages = sorted(p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*.html"))
    assert pages == ["alice/01_tiny.html", "bob/01_tiny.html", "carol.txt.html"]
    alice = (out_dir / "alice" / "01_tiny.html").read_text()
    assert "Score: 0 / 3 points" in alice
    assert "answer() should be 42; yours is 41" in alice  # the failing test's message
    assert "Return 42." in alice and "Write `double(x)`." in alice  # the question texts
    assert "deleted cells put back" in alice and "q2-md" in alice  # the notes
    assert "AssertionError in a hidden check" in alice  # the bare hidden assert: no code
    assert "Score: 3 / 3 points" in (out_dir / "bob" / "01_tiny.html").read_text()
    assert "Not graded: not a notebook" in (out_dir / "carol.txt.html").read_text()
    for page in out_dir.rglob("*.html"):
        text = page.read_text()
        assert "HIDDEN-MARK" not in text and "SOLUTION-MARK" not in text
        assert "double(-7)" not in text and "<script" not in text
    # the log's message keeps the hidden line for the instructor; the page never shows it
    log = [json.loads(line) for line in (tmp_path / "grades.jsonl").read_text().splitlines()]
    alice_log = next(r for r in log if "alice" in r["submission"])
    double = next(t for t in alice_log["tests"] if t["grade_id"] == "double")
    assert "double(-7)" in double["message"]
    # the same pages again, from the log, as Markdown
    status, _ = run_cli("feedback", str(tmp_path / "grades.jsonl"), "--source", str(source),
                        "--out", str(tmp_path / "md"), "--format", "md")
    assert status == 0
    md = (tmp_path / "md" / "alice" / "01_tiny.ipynb").with_suffix(".md").read_text()  # named after it
    assert "| answer | 0 / 1 | fail |" in md and "> Return 42." in md
    assert "double(-7)" not in md


def test_html_feedback_escapes_learner_text(tmp_path):
    source = grading.load_sources(tiny_course(tmp_path))["01_tiny.ipynb"]
    result = SubmissionResult("x/<b>01_tiny.ipynb", "01_tiny.ipynb", tests=[
        TestResult("answer", 0, 1, "fail", "ValueError: <script>alert(1)</script>"),
        TestResult("double", 2, 2, "pass")], issues=["code cell 'x' (\"<img src=x>\")"])
    page = feedback_html(result, source)
    assert "<script>" not in page and "&lt;script&gt;" in page and "<img" not in page


def hidden_and_solution_lines() -> list[tuple[str, str, str]]:
    """(kind, notebook, line) for every line of a solution or hidden-test region of the
    course's sources that does not also appear in the released exercise."""
    found = []
    for path in sorted(SOLUTIONS.glob("*.ipynb")):
        text = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
        released = (EXERCISES / path.name).read_text()
        for kind, body in REGION.findall(text):
            for line in body.splitlines():
                line = line.strip()
                if len(line) >= 12 and json.dumps(line)[1:-1] not in released:
                    found.append((kind, path.name, line))
    return found


def test_feedback_of_the_course_leaks_no_solution_and_no_hidden_test():
    """Every test of every exercise failing with a message that quotes a hidden line (what a
    bare assert in a hidden check gives): no page holds a hidden or solution line."""
    sources = grading.load_sources(SOLUTIONS)
    secret = hidden_and_solution_lines()
    assert {kind for kind, _, _ in secret} == {"SOLUTION", "HIDDEN TESTS"}
    for name, source in sources.items():
        cells = {c.metadata["nbgrader"]["grade_id"]: c.source for c in source.nb.cells
                 if c.get("metadata", {}).get("nbgrader", {}).get("grade")}
        tests = []
        for test in source.tests:
            lines = cells[test.grade_id].splitlines()
            hidden = [n for n, line in enumerate(lines, 1) if "### BEGIN HIDDEN" in line]
            number = hidden[0] + 1 if hidden else 1
            message = f"AssertionError at line {number}: {lines[number - 1].strip()}"
            tests.append(TestResult(test.grade_id, 0, test.points, "fail", message))
        result = SubmissionResult(f"class/{name}", name, tests=tests)
        for page in (feedback_html(result, source), feedback_markdown(result, source)):
            leaks = [(kind, line) for kind, nb, line in secret
                     if nb == name and (line in page or line in __import__("html").unescape(page))]
            assert not leaks, (name, leaks[:3])
        texts = question_texts(source)
        assert set(texts) == {t.grade_id for t in source.tests}
        assert all(texts.values()), [g for g, t in texts.items() if not t]


def test_safe_message_cuts_only_hidden_lines():
    cell = "assert f(1) == 1\n### BEGIN HIDDEN TESTS\nassert f(2) == 2\n### END HIDDEN TESTS"
    assert safe_message("AssertionError at line 3: assert f(2) == 2", cell) == (
        "AssertionError in a hidden check")
    assert safe_message("AssertionError at line 1: assert f(1) == 1", cell) == (
        "AssertionError at line 1: assert f(1) == 1")
    assert safe_message("AssertionError: hidden check: f(2)", cell) == (
        "AssertionError: hidden check: f(2)")


# --------------------------------------------------------------------------- gradebook


def result(path, source, score, max_score=3.0, error=None):
    tests = [] if error else [TestResult("q", score, max_score, "pass" if score else "fail")]
    return SubmissionResult(path, source if not error else None, tests=tests, error=error)


ROSTER = (
    "learner,name,email,submission,canvas_id,section\n"
    "s001,Alice A,alice@example.org,alice,101,A\n"
    "s002,Bob B,bob@example.org,bob_;bobby,102,A\n"
    "s003,Carol C,carol@example.org,carolc,103,B\n"
)


def test_the_roster_gradebook_and_its_exports(tmp_path):
    roster_path = tmp_path / "roster.csv"
    roster_path.write_text(ROSTER)
    roster = grading.read_roster(roster_path)
    assert [lr.learner for lr in roster] == ["s001", "s002", "s003"]
    results = [
        result("class/alice/01_x.ipynb", "01_x.ipynb", 3),
        result("class/alice/02_y.ipynb", "02_y.ipynb", 1, 4),
        result("class/bobby_4711_99_01_x.ipynb", "01_x.ipynb", 2),  # an LMS download's name
        result("class/bobby/01_x_again.ipynb", "01_x.ipynb", 1),   # a second try: best counts
        result("class/bobby/notes.txt", None, 0, error="not a notebook"),
        result("class/dave/01_x.ipynb", "01_x.ipynb", 3),  # nobody's
    ]
    book = grading.build_gradebook(results, roster, ["01_x.ipynb", "02_y.ipynb"],
                                   {"01_x.ipynb": 3.0, "02_y.ipynb": 4.0})
    assert book.unmatched == [("class/dave/01_x.ipynb", "no roster name matches it")]
    assert book.missing() == [("s002", ["02_y.ipynb"]), ("s003", ["01_x.ipynb", "02_y.ipynb"])]
    table = grading.summary_by_learner(book)
    assert list(table.columns) == ["learner", "name", "01_x", "02_y", "total", "max_total",
                                   "notes"]
    rows = {r.learner: r for r in table.itertuples(index=False)}
    assert (rows["s001"]._2, rows["s001"]._3, rows["s001"].total) == (3, 1, 4)
    assert rows["s002"]._2 == 2 and rows["s002"].max_total == 7
    assert "2 submissions of 01_x: the highest score counts" in rows["s002"].notes
    assert "not graded: class/bobby/notes.txt: not a notebook" in rows["s002"].notes
    assert table["01_x"].isna().tolist() == [False, False, True]

    grading.write_moodle(book, tmp_path / "moodle.csv")
    moodle = list(csv.reader((tmp_path / "moodle.csv").open()))
    assert moodle[0] == ["ID number", "Email address", "Full name", "01_x", "02_y"]
    assert moodle[1:] == [["s001", "alice@example.org", "Alice A", "3", "1"],
                          ["s002", "bob@example.org", "Bob B", "2", ""],
                          ["s003", "carol@example.org", "Carol C", "", ""]]
    grading.write_canvas(book, tmp_path / "canvas.csv")
    canvas = list(csv.reader((tmp_path / "canvas.csv").open()))
    assert canvas[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "01_x",
                         "02_y"]
    assert canvas[1] == ["Points Possible", "", "", "", "", "3", "4"]
    assert canvas[2] == ["Alice A", "101", "s001", "", "A", "3", "1"]
    assert canvas[4] == ["Carol C", "103", "s003", "", "B", "", ""]


def test_ambiguous_names_and_bad_rosters_are_clear(tmp_path):
    (tmp_path / "r.csv").write_text("learner,submission\ns1,ann\ns2,ann_b\n")
    roster = grading.read_roster(tmp_path / "r.csv")
    book = grading.build_gradebook([result("c/ann_b_01_x.ipynb", "01_x.ipynb", 1)], roster)
    assert book.unmatched == [("c/ann_b_01_x.ipynb",
                               "the names of several learners match it: s1, s2")]
    for text, problem in [("id,submission\n", "missing: learner"),
                          ("learner,submission\n,alice\n", "line 2: no learner id"),
                          ("learner,submission\ns1,\n", "has no submission name"),
                          ("learner,submission\ns1,x\ns2,x\n", "given to both 's1' and 's2'")]:
        (tmp_path / "bad.csv").write_text(text)
        with pytest.raises(ValueError, match=re.escape(problem)):
            grading.read_roster(tmp_path / "bad.csv")


def test_the_gradebook_command_from_a_grading_log(tmp_path):
    source, folder = tiny_class(tmp_path, n=2)
    status, _ = run_cli("grade", str(folder), "--source", str(source), "--no-sandbox",
                        "--csv", str(tmp_path / "grades.csv"))
    assert status == 0
    (tmp_path / "roster.csv").write_text("learner,submission\nL0,learner0\nL9,learner9\n")
    status, out = run_cli("gradebook", str(tmp_path / "grades.jsonl"), "--source", str(source),
                          "--roster", str(tmp_path / "roster.csv"), "--csv",
                          str(tmp_path / "book.csv"), "--moodle", str(tmp_path / "moodle.csv"))
    assert status == 1  # learner1's submission is nobody's, L9 has none
    assert re.search(r"unmatched submission: .*learner1/01_tiny.ipynb", out)
    assert "missing: L9: 01_tiny" in out
    rows = list(csv.DictReader((tmp_path / "book.csv").open()))
    assert [(r["learner"], r["01_tiny"], r["max_total"]) for r in rows] == [
        ("L0", "3", "3"), ("L9", "", "3")]


# --------------------------------------------------------------------------- exercise 04 twice


def test_two_exercise_04_gradings_at_once_do_not_collide(tmp_path):
    """Two torchrun launches side by side, each in its own kernel (and sandbox where bubblewrap
    is installed): no shared port, rendezvous or temporary folder; both score full marks."""
    name = "04_scaling_out.ipynb"
    folder = tmp_path / "class"
    for who in ("alice", "bob"):
        (folder / who).mkdir(parents=True)
        shutil.copy(SOLUTIONS / name, folder / who / name)
    sandbox = True if shutil.which("bwrap") or IN_CI else False
    results = grading.grade([folder], SOLUTIONS, sandbox=sandbox, jobs=2, cell_timeout=240,
                            timeout=400)
    for r in results:
        failed = {t.grade_id: t.message for t in r.tests if t.status != "pass"}
        assert r.graded and not failed and r.score == r.max_score > 0, (r.submission, failed,
                                                                         r.error)


# --------------------------------------------------------------------------- the guide's times


def test_the_guides_grading_times_come_from_a_committed_run():
    guide = (ROOT / "docs" / "instructors.md").read_text()
    links = re.findall(r"\(\.\./(results/grading-times-[^)]+/grading-times\.md)\)", guide)
    assert links, "docs/instructors.md should cite a results/grading-times-*/ run"
    run = ROOT / links[0]
    report = json.loads(run.with_suffix(".json").read_text())
    exercises = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
    assert report["submissions"] == 6 * len(exercises) and report["identical_scores"] is True
    assert [r["jobs"] for r in report["runs"]] == [1, 2]
    assert report["command"].startswith("python tools/bench_grading.py")
    section = guide.split("**How long grading takes.**", 1)[1].split("\n## ", 1)[0]
    quoted = [line for line in section.splitlines() if line.startswith("|")]
    lines = run.read_text().splitlines()
    assert len(quoted) >= 6 and all(line in lines for line in quoted), (
        f"the guide's tables should be copied from {links[0]}")
