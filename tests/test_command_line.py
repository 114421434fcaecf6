"""Every command-line entry point against bad input (issue 27 item 5): a missing file, an output
path that cannot be written (missing parent, a file where a folder is needed, a folder where a
file is needed, a place nothing can be written), a value of the wrong type, a number out of
range. Each is refused in words before any work starts, exit status 2, no traceback, and
nothing is written. (The sandbox's refusal is tests/test_grade_sandbox.py's; --out of
course-profile, tests/test_cli_profile.py's.)
"""
from __future__ import annotations

import sys

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

import course_grade
from course_utils import cli as bench_cli
from course_utils import cli_profile

ENTRY = {"course-bench": bench_cli.main, "course-profile": cli_profile.main,
         "course-grade": course_grade.main}
PROFILE = ["--course-gpt", "--size", "smoke", "--device", "cpu"]
UNWRITABLE = "/proc/course-command-line-test"  # nothing can be made there, root included


@pytest.fixture
def place(tmp_path, monkeypatch):
    """A working folder with a tiny source (src/), its released copy (class/), a file (afile),
    an empty folder (empty/), a malformed log and a roster."""
    monkeypatch.chdir(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    meta = {"nbgrader": {"grade": True, "grade_id": "one", "points": 1, "locked": True,
                         "solution": False}}
    nbformat.write(new_notebook(cells=[new_code_cell("assert 1 + 1 == 2", id="t", metadata=meta)]),
                   src / "01_one.ipynb")
    course_grade.release(src, tmp_path / "class")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.jsonl").write_text('{"a": 1')
    (tmp_path / "roster.csv").write_text("learner,submission\ns1,class\n")
    return tmp_path


def run(entry: str, argv: list[str], capsys) -> tuple[int, str]:
    try:
        status = ENTRY[entry](argv)
    except SystemExit as stop:  # argparse's refusals
        status = stop.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return status, err


def check(entry, argv, words, place, capsys):
    before = sorted(p.relative_to(place) for p in place.rglob("*"))
    status, err = run(entry, argv, capsys)
    assert status == 2, (status, err)
    assert words in err, err
    assert "[Errno" not in err  # words, never an errno
    assert sorted(p.relative_to(place) for p in place.rglob("*")) == before  # nothing written


@pytest.mark.parametrize("entry, argv, words", [
    ("course-grade", ["grade", "nowhere.ipynb", "--source", "src"], "no such file or folder: nowhere.ipynb"),
    ("course-grade", ["grade", "class", "--source", "missing"], "source folder missing does not exist"),
    ("course-grade", ["grade", "class", "--source", "afile"], "source folder afile is a file"),
    ("course-grade", ["feedback", "missing.jsonl", "--out", "fb", "--source", "src"],
     "the log 'missing.jsonl': no such file"),
    ("course-grade", ["feedback", "empty", "--out", "fb", "--source", "src"], "the log 'empty' is a folder"),
    ("course-grade", ["feedback", "bad.jsonl", "--out", "fb", "--source", "src"], "bad.jsonl, line 1"),
    ("course-grade", ["gradebook", "bad.jsonl", "--roster", "missing.csv", "--source", "src"],
     "--roster 'missing.csv': no such file"),
    ("course-profile", ["nosuchmodule:build"], "cannot load 'nosuchmodule:build'"),
])
def test_a_missing_or_malformed_input_file(entry, argv, words, place, capsys):
    check(entry, argv, words, place, capsys)


@pytest.mark.parametrize("entry, argv, words", [
    ("course-bench", ["--size", "smoke", "--out", "nodir/sub"], "its parent folder 'nodir' does not exist"),
    ("course-bench", ["--size", "smoke", "--out", "afile"], "is an existing file, not a folder"),
    ("course-bench", ["--size", "smoke", "--out", "afile/sub"], "'afile' is not a folder"),
    ("course-grade", ["grade", "class", "--source", "src", "--no-sandbox", "--csv", "empty"],
     "--csv 'empty' is a folder: give a file name"),
    ("course-grade", ["grade", "class", "--source", "src", "--no-sandbox", "--csv", "afile/g.csv"],
     "'afile' is a file, not a folder"),
    ("course-grade", ["grade", "class", "--source", "src", "--no-sandbox", "--log", "empty"],
     "--log 'empty' is a folder"),
    ("course-grade", ["grade", "class", "--source", "src", "--no-sandbox", "--feedback", "afile"],
     "--feedback 'afile' is a file, not a folder"),
    ("course-grade", ["release", "--source", "src", "--dest", "afile"],
     "--dest 'afile' is a file, not a folder"),
    ("course-grade", ["release", "--source", "src", "--dest", "afile/sub"],
     "'afile' is a file, not a folder"),
    ("course-grade", ["release", "--source", "src", "--student", "afile/b"],
     "'afile' is a file, not a folder"),
    ("course-grade", ["feedback", "bad.jsonl", "--out", "afile", "--source", "src"],
     "--out 'afile' is a file, not a folder"),
    ("course-grade", ["gradebook", "bad.jsonl", "--roster", "roster.csv", "--source", "src",
                      "--csv", "empty"],
     "--csv 'empty' is a folder"),
])
def test_an_output_path_of_the_wrong_kind(entry, argv, words, place, capsys):
    check(entry, argv, words, place, capsys)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
@pytest.mark.parametrize("entry, argv, words", [
    ("course-bench", ["--size", "smoke", "--out", UNWRITABLE], "'/proc' is not writable"),
    ("course-grade", ["grade", "class", "--source", "src", "--no-sandbox", "--csv", f"{UNWRITABLE}.csv"],
     "cannot write into '/proc'"),
    ("course-grade", ["grade", "class", "--source", "src", "--no-sandbox", "--feedback", UNWRITABLE],
     "cannot write into '/proc'"),
    ("course-grade", ["release", "--source", "src", "--dest", UNWRITABLE], "cannot write into '/proc'"),
    ("course-grade", ["gradebook", "bad.jsonl", "--roster", "roster.csv", "--source", "src",
                      "--moodle", f"{UNWRITABLE}.csv"],
     "cannot write into '/proc'"),
])
def test_an_unwritable_output_path(entry, argv, words, place, capsys):
    check(entry, argv, words, place, capsys)


@pytest.mark.parametrize("entry, argv, words", [
    ("course-bench", ["--steps", "abc"], "expected a positive integer, got 'abc'"),
    ("course-bench", ["--budget", "abc"], "expected a positive number of seconds, got 'abc'"),
    ("course-bench", ["--size", "huge"], "invalid choice: 'huge'"),
    ("course-bench", ["--precisions", "fp8"], "unknown precision ['fp8']"),
    ("course-bench", ["--size", "smoke", "--device", "foo"], "unknown device 'foo'"),
    ("course-profile", [*PROFILE, "--batch-size", "two"], "expected a positive integer, got 'two'"),
    ("course-profile", [*PROFILE, "--budget", "lots"], "expected a size such as 14GiB"),
    ("course-profile", [*PROFILE, "--policies", "bogus"], "checkpoint policy 'bogus'"),
    ("course-grade", ["grade", "class", "--source", "src", "-j", "two"], "not a whole number of jobs: 'two'"),
    ("course-grade", ["grade", "class", "--source", "src", "--max-size", "lots"],
     "not a number of MiB: 'lots'"),
])
def test_a_value_of_the_wrong_type(entry, argv, words, place, capsys):
    check(entry, argv, words, place, capsys)


@pytest.mark.parametrize("entry, argv, words", [
    ("course-bench", ["--size", "smoke", "--budget", "inf"],
     "expected a positive number of seconds, got 'inf'"),
    ("course-bench", ["--size", "smoke", "--budget", "0"], "expected a positive number of seconds, got '0'"),
    ("course-bench", ["--size", "smoke", "--steps", "0"], "expected a positive integer, got '0'"),
    ("course-bench", ["--size", "smoke", "--batch-size", "1000000000"], "estimated peak"),
    ("course-profile", [*PROFILE, "--time-budget", "nan"], "expected a positive number of seconds"),
    ("course-profile", [*PROFILE, "--policies", "every-0"], "checkpoint policy 'every-0'"),
    ("course-profile", [*PROFILE, "--batch-size", "1000000000"], "give --batch-size"),
    ("course-grade", ["grade", "class", "--source", "src", "--timeout", "nan"],
     "must be a positive number of seconds: 'nan'"),
    ("course-grade", ["grade", "class", "--source", "src", "--memory=-1"], "must be a number of MiB >= 0"),
    ("course-grade", ["grade", "class", "--source", "src", "-j", "0"], "must be at least 1 job"),
])
def test_a_number_out_of_range(entry, argv, words, place, capsys):
    check(entry, argv, words, place, capsys)
