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
* grading (:mod:`course_grade.grade`): ``grade``, ``grade_files``, ``grade_submission``,
  ``find_submissions``, ``submission_files``,
  ``Stop``, ``GradingInterrupted`` (:mod:`course_grade.stop`); results
  (:mod:`course_grade.results`): ``SubmissionResult``, ``TestResult``, ``clean_text``,
  ``display_path``;
* the sandbox (:mod:`course_grade.sandbox`): ``Sandbox``, ``SandboxError``, ``choose_sandbox``;
* reports (:mod:`course_grade.report`): ``results_table``, ``summary_table``, ``write_csv``,
  ``Journal``, ``read_log``;
* parallel grading (:mod:`course_grade.parallel`): ``default_jobs``, ``threads_per_job``;
* feedback pages (:mod:`course_grade.feedback`): ``write_feedback``, ``feedback_html``,
  ``feedback_markdown``;
* the gradebook (:mod:`course_grade.gradebook`): ``read_roster``, ``build_gradebook``,
  ``summary_by_learner``, ``write_summary``, ``write_moodle``, ``write_canvas``;
* ``main``, the command line.
"""

from .cli import main
from .feedback import feedback_html, feedback_markdown, write_feedback
from .grade import find_submissions, grade, grade_files, grade_submission, submission_files
from .gradebook import (
    build_gradebook,
    read_roster,
    summary_by_learner,
    write_canvas,
    write_moodle,
    write_summary,
)
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
from .parallel import default_jobs, threads_per_job
from .release import check_release, release, release_notebook, release_student
from .report import Journal, read_log, results_table, summary_table, write_csv
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
    "build_gradebook",
    "check_release",
    "choose_sandbox",
    "clean_text",
    "clear_solutions",
    "default_jobs",
    "display_path",
    "feedback_html",
    "feedback_markdown",
    "find_submissions",
    "grade",
    "grade_files",
    "grade_submission",
    "load_source",
    "load_sources",
    "main",
    "read_log",
    "read_roster",
    "read_submission",
    "release",
    "release_notebook",
    "release_student",
    "remove_hidden_tests",
    "results_table",
    "submission_files",
    "summary_by_learner",
    "summary_table",
    "threads_per_job",
    "write_canvas",
    "write_csv",
    "write_feedback",
    "write_moodle",
    "write_summary",
]
