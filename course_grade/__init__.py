"""course_grade: release and autograde the course's graded notebooks (on nbformat + nbclient).

A tool for instructors; the learner's package ``course_utils`` never imports it. The command is
``course-grade`` (:func:`course_grade.cli.main`); see docs/instructors.md.

Public API (everything else is internal):

* the source format (:mod:`course_grade.notebook`): ``GradingError``, the markers
  ``BEGIN_SOLUTION``/``END_SOLUTION``/``BEGIN_HIDDEN_TESTS``/``END_HIDDEN_TESTS``,
  ``clear_solutions``, ``remove_hidden_tests``, ``load_source``, ``load_sources``,
  ``SourceNotebook``, ``TestCell``, ``read_submission``;
* release (:mod:`course_grade.release`): ``release_notebook``, ``release``, ``check_release``,
  ``release_student``;
* grading (:mod:`course_grade.grade`): ``grade``, ``grade_submission``, ``find_submissions``,
  ``Stop``, ``GradingInterrupted`` (:mod:`course_grade.stop`); results
  (:mod:`course_grade.results`): ``SubmissionResult``, ``TestResult``, ``clean_text``,
  ``display_path``;
* the sandbox (:mod:`course_grade.sandbox`): ``Sandbox``, ``SandboxError``, ``choose_sandbox``;
* reports (:mod:`course_grade.report`): ``results_table``, ``summary_table``, ``write_csv``,
  ``Journal``;
* ``main``, the command line.
"""

from .cli import main
from .grade import find_submissions, grade, grade_submission
from .notebook import (
    BEGIN_HIDDEN_TESTS,
    BEGIN_SOLUTION,
    END_HIDDEN_TESTS,
    END_SOLUTION,
    GradingError,
    SourceNotebook,
    TestCell,
    clear_solutions,
    load_source,
    load_sources,
    read_submission,
    remove_hidden_tests,
)
from .release import check_release, release, release_notebook, release_student
from .report import Journal, results_table, summary_table, write_csv
from .results import SubmissionResult, TestResult, clean_text, display_path
from .sandbox import Sandbox, SandboxError, choose_sandbox
from .stop import GradingInterrupted, Stop

__all__ = [
    "BEGIN_SOLUTION",
    "END_SOLUTION",
    "BEGIN_HIDDEN_TESTS",
    "END_HIDDEN_TESTS",
    "GradingError",
    "GradingInterrupted",
    "Journal",
    "Sandbox",
    "SandboxError",
    "SourceNotebook",
    "Stop",
    "SubmissionResult",
    "TestCell",
    "TestResult",
    "check_release",
    "choose_sandbox",
    "clean_text",
    "clear_solutions",
    "display_path",
    "find_submissions",
    "grade",
    "grade_submission",
    "load_source",
    "load_sources",
    "main",
    "read_submission",
    "release",
    "release_notebook",
    "release_student",
    "remove_hidden_tests",
    "results_table",
    "summary_table",
    "write_csv",
]
