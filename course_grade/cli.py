"""The ``course-grade`` command.

::

    course-grade release [--source solutions] [--dest exercises] [--check]
    course-grade release --student DIR [--source solutions] [--lessons DIR]
    course-grade grade SUBMISSION_OR_FOLDER... [--source solutions] [-j N] [--csv FILE]
                       [--log FILE] [--json] [--cell-timeout S] [--timeout S] [--memory MIB]
                       [--max-size MIB] [--sandbox | --no-sandbox] [--feedback DIR]
                       [--feedback-format html|md]
    course-grade feedback LOG.jsonl... --out DIR [--source solutions] [--format html|md]
    course-grade gradebook LOG.jsonl... --roster ROSTER.csv [--source solutions]
                       [--csv FILE] [--moodle FILE] [--canvas FILE]

Exit status of ``grade``: 0 every submission was graded and every result written; 1 some
submissions could not be graded; 2 bad arguments, malformed sources, or no working sandbox where
one is needed (nothing graded: ``--sandbox`` was given, or the submissions are a class or not
the learner's own notebook, :func:`course_grade.sandbox.own_work`, and ``--no-sandbox`` was
not); 3 graded, but the results were only partly written (the CSV or the log failed: the
message says where the results are); 130 (Ctrl-C) or 143
(SIGTERM): stopped early, the submissions graded before the stop are written and the others are
not graded. With ``-j N`` several submissions are graded at once (see
:mod:`course_grade.parallel`); the tables, the CSV and ``--json`` keep the files' order.

``feedback`` writes one page per result of the logs (see :mod:`course_grade.feedback`): exit
status 0, or 2 for an unreadable log or malformed sources. ``gradebook`` matches the logs'
results to a roster (see :mod:`course_grade.gradebook`): 0, or 1 when a submission is unmatched
or a learner misses an exercise (the files are written either way), 2 for a bad roster or log.

Over 400 lines because it is the whole command line of ``course-grade``: every subcommand's
arguments, checks and exit statuses in one place, each subcommand one function.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
from pathlib import Path
from typing import Sequence

from . import gradebook
from .execute import DEFAULT_CELL_TIMEOUT, DEFAULT_TIMEOUT
from .feedback import FORMATS, write_feedback
from .files import MiB, check_input, check_output
from .grade import grade_files, submission_files
from .notebook import DEFAULT_MAX_SIZE, GradingError, load_sources
from .parallel import default_jobs, threads_per_job
from .release import check_release, release, release_student
from .report import (
    Journal,
    print_progress,
    print_result,
    print_summary,
    read_log,
    write_csv,
)
from .results import display_path
from .sandbox import DEFAULT_MEMORY, SandboxError, choose_sandbox, own_work
from .stop import GradingInterrupted, Stop

EXIT_OK = 0  # every submission graded, every result written
EXIT_NOT_GRADED = 1  # some submissions could not be graded (release --check: out of date)
EXIT_USAGE = 2  # bad arguments or malformed sources: nothing graded
EXIT_PARTLY_WRITTEN = 3  # graded, but the CSV or the log could not be (fully) written
EXIT_SIGNAL_BASE = 128  # stopped by a signal: 128 + its number (130 Ctrl-C, 143 SIGTERM)


def _number(parse, unit: str, ok, rule: str):
    """An argparse type: ``parse(text)`` (``int`` or ``float``), refused unless ``ok(value)``;
    errors say "not a <unit>" or "must be <rule>", quoting the text."""
    def number(text: str):
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {unit}: {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {rule}: {text!r}")
        return value
    return number


_positive_seconds = _number(float, "number of seconds", lambda v: math.isfinite(v) and v > 0,
                            "a positive number of seconds")
_jobs = _number(int, "whole number of jobs", lambda v: v >= 1, "at least 1 job")
_mib = _number(float, "number of MiB", lambda v: math.isfinite(v) and v >= 0,
               "a number of MiB >= 0")


def _mebibytes(text: str) -> int:
    """MiB on the command line, bytes inside (0 stays 0)."""
    return int(_mib(text) * MiB)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="course-grade",
        description="Release the course's graded notebooks and autograde submissions.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_release(commands)
    _add_grade(commands)
    _add_feedback(commands)
    _add_gradebook(commands)
    return parser


def _add_release(commands) -> None:
    rel = commands.add_parser(
        "release", help="regenerate exercises/ from solutions/, or write the student bundle",
        description="Write the learner's copy of every graded notebook (solutions -> exercises), "
        "or with --student the whole bundle learners get.",
    )
    rel.add_argument("--source", default="solutions", help="source folder (default: solutions)")
    rel.add_argument("--dest", default="exercises", help="output folder (default: exercises)")
    rel.add_argument("--check", action="store_true",
                     help="write nothing; exit 1 if DEST is out of date with SOURCE")
    rel.add_argument("--student", metavar="DIR",
                     help="write the learners' bundle to DIR (a new or empty folder): lessons, "
                          "released exercises, course_utils, pyproject.toml, README; no "
                          "solutions, hidden tests or grader")
    rel.add_argument("--lessons", metavar="DIR", default=None,
                     help="lesson folder for --student (default: notebooks/ next to SOURCE)")


def _add_grade(commands) -> None:
    grd = commands.add_parser(
        "grade", help="grade submissions (notebooks or folders of them)",
        description="Execute each submission with the source's tests and score it. Exit status "
        "0: every submission graded and written; 1: some could not be graded; 2: bad arguments; "
        "3: results only partly written; 130/143: stopped by Ctrl-C/SIGTERM (graded ones kept).",
    )
    grd.add_argument("paths", nargs="+", metavar="SUBMISSION_OR_FOLDER")
    grd.add_argument("--source", default="solutions", help="source folder (default: solutions)")
    grd.add_argument(
        "-j", "--jobs", type=_jobs, default=None, metavar="N",
        help="grade N submissions at once, each in its own kernel and sandbox, with "
        "OMP_NUM_THREADS divided among them (default: one per usable core, at most one per "
        "2 GiB of memory)",
    )
    grd.add_argument("--csv", metavar="FILE",
                     help="write one row per submission to FILE (atomically, at the end)")
    grd.add_argument(
        "--log", metavar="FILE",
        help="append each result to FILE (JSON lines) as soon as it is graded "
        "(default with --csv: the CSV's name with .jsonl)",
    )
    grd.add_argument("--json", action="store_true", help="print the results as JSON, no tables")
    grd.add_argument(
        "--cell-timeout", type=_positive_seconds, default=DEFAULT_CELL_TIMEOUT, metavar="S",
        help=f"seconds per cell (default: {DEFAULT_CELL_TIMEOUT:g})",
    )
    grd.add_argument(
        "--timeout", type=_positive_seconds, default=DEFAULT_TIMEOUT, metavar="S",
        help=f"seconds per notebook, kernel start included (default: {DEFAULT_TIMEOUT:g})",
    )
    grd.add_argument(
        "--memory", type=_mebibytes, default=DEFAULT_MEMORY, metavar="MIB",
        help="address space a kernel may use, in MiB; 0: no limit "
        f"(default: {DEFAULT_MEMORY // MiB})",
    )
    grd.add_argument(
        "--max-size", type=_mebibytes, default=DEFAULT_MAX_SIZE, metavar="MIB",
        help=f"largest submission file read, in MiB (default: {DEFAULT_MAX_SIZE // MiB})",
    )
    grd.add_argument(
        "--feedback", metavar="DIR",
        help="write one feedback page per submission into DIR (score per question, failing "
        "tests' messages, notes, question text; no solution, no hidden test)",
    )
    grd.add_argument("--feedback-format", choices=FORMATS, default="html",
                     help="feedback pages as HTML or Markdown (default: html)")
    box = grd.add_mutually_exclusive_group()
    box.add_argument(
        "--sandbox", dest="sandbox", action="store_const", const=True, default=None,
        help="require the bubblewrap sandbox (default: use it when it works; without it, only "
        "your own notebook inside the course folder is graded, anything else is refused)",
    )
    box.add_argument(
        "--no-sandbox", dest="sandbox", action="store_const", const=False,
        help="run learner code unsandboxed, as your user, with your files, processes and "
        "network: you accept that risk",
    )


def _add_feedback(commands) -> None:
    fbk = commands.add_parser(
        "feedback", help="write feedback pages from grading logs",
        description="Write one feedback page per submission of the grading logs (--log, "
        "JSON lines) into DIR, as HTML or Markdown.",
    )
    fbk.add_argument("logs", nargs="+", metavar="LOG.jsonl")
    fbk.add_argument("--out", required=True, metavar="DIR", help="folder for the pages")
    fbk.add_argument("--source", default="solutions", help="source folder (default: solutions)")
    fbk.add_argument("--format", choices=FORMATS, default="html",
                     help="HTML or Markdown (default: html)")


def _add_gradebook(commands) -> None:
    book = commands.add_parser(
        "gradebook", help="one row per learner from grading logs and a roster; LMS exports",
        description="Match the results of grading logs (--log, JSON lines) to a roster and "
        "write one row per learner, one column per exercise; list unmatched submissions and "
        "learners missing an exercise. Exit status 0, or 1 when some submission is unmatched "
        "or some learner misses an exercise (everything is still written).",
    )
    book.add_argument("logs", nargs="+", metavar="LOG.jsonl")
    book.add_argument("--roster", required=True, metavar="CSV",
                      help="columns learner, submission (folder or file names, ';'-separated); "
                      "optional name, email, section, canvas_id, login")
    book.add_argument("--source", default="solutions", help="source folder (default: solutions)")
    book.add_argument("--csv", metavar="FILE", help="write the summary (one row per learner)")
    book.add_argument("--moodle", metavar="FILE", help="write Moodle's grade import CSV")
    book.add_argument("--canvas", metavar="FILE", help="write Canvas's gradebook import CSV")


def _feedback(args, out) -> int:
    sources = load_sources(args.source)
    for log in args.logs:
        check_input(log, "the log")
    check_output(args.out, "--out", folder=True)
    results = [result for log in args.logs for result in read_log(log)]
    written = write_feedback(results, sources, args.out, args.format)
    print(f"wrote {len(written)} feedback pages to {display_path(args.out)}", file=out)
    return EXIT_OK


def _gradebook(args, out) -> int:
    sources = load_sources(args.source)
    for log in args.logs:
        check_input(log, "the log")
    check_input(args.roster, "--roster")
    for flag in ("csv", "moodle", "canvas"):
        if getattr(args, flag):
            check_output(getattr(args, flag), f"--{flag}")
    results = [result for log in args.logs for result in read_log(log)]
    roster = gradebook.read_roster(args.roster)
    max_points = {name: src.max_points for name, src in sources.items()}
    book = gradebook.build_gradebook(results, roster, list(sources), max_points)
    table = gradebook.summary_by_learner(book)
    print(table.drop(columns=["notes"]).to_string(index=False, na_rep=""), file=out)
    for path, writer in ((args.csv, gradebook.write_summary), (args.moodle, gradebook.write_moodle),
                         (args.canvas, gradebook.write_canvas)):
        if path:
            writer(book, path)
            print(f"wrote {display_path(path)}", file=out)
    for submission, why in book.unmatched:
        print(f"unmatched submission: {submission}: {why}", file=out)
    for learner, absent in book.missing():
        print(f"missing: {learner}: {', '.join(Path(e).stem for e in absent)}", file=out)
    for record in table.itertuples(index=False):
        if record.notes:
            print(f"note: {record.learner}: {record.notes}", file=out)
    return EXIT_NOT_GRADED if book.unmatched or book.missing() else EXIT_OK


def _release(args, out) -> int:
    if args.student:
        if args.check:
            print("course-grade: error: --check and --student do not go together", file=sys.stderr)
            return EXIT_USAGE
        check_output(args.student, "--student", folder=True)
        written = release_student(args.student, args.source, args.lessons)
        where = display_path(args.student)
        print(f"wrote the student bundle to {where} ({len(written)} files)", file=out)
        return EXIT_OK
    if args.check:
        problems = check_release(args.source, args.dest)
        for problem in problems:
            print(problem, file=out)
        if problems:
            print(f"run `course-grade release --source {args.source} --dest {args.dest}`", file=out)
            return EXIT_NOT_GRADED
        print(f"{args.dest}/ is up to date with {args.source}/", file=out)
        return EXIT_OK
    load_sources(args.source)  # malformed sources: an error before the folder is checked
    check_output(args.dest, "--dest", folder=True)
    written = release(args.source, args.dest)
    for path in written:
        print(f"wrote {display_path(path)}", file=out)
    if not written:
        print(f"{args.dest}/ is already up to date with {args.source}/", file=out)
    for problem in check_release(args.source, args.dest):
        print(f"warning: {problem}", file=out)
    return EXIT_OK


def _output_paths(args) -> tuple[Path | None, Path | None]:
    """The CSV and the log ``grade`` writes (the log beside the CSV by default), each checked
    before any work, with the feedback folder; malformed sources raise first."""
    csv_path = Path(args.csv) if args.csv else None
    log_path = Path(args.log) if args.log else None
    if log_path is None and csv_path is not None:
        log_path = csv_path.with_suffix(".jsonl")
    if csv_path is not None and log_path is not None and csv_path.resolve() == log_path.resolve():
        log_path = csv_path.with_name(csv_path.name + ".jsonl")
    load_sources(args.source)  # malformed sources: an error before anything else
    log_label = "--log" if args.log else "the log beside --csv"
    for label, path in (("--csv", csv_path), (log_label, log_path)):
        if path is not None:
            check_output(path, label)
    if args.feedback:
        check_output(args.feedback, "--feedback", folder=True)
    return csv_path, log_path


def _grade(args, out) -> int:
    err = sys.stderr
    csv_path, log_path = _output_paths(args)
    missing = [p for p in args.paths if not Path(p).exists() and not Path(p).is_symlink()]
    if missing:
        raise GradingError(f"no such file or folder: {', '.join(map(display_path, missing))}")
    written_to = [p for p in (csv_path, log_path) if p is not None]
    files = submission_files(args.paths, written_to)
    if not files:
        raise GradingError("no submissions: the paths given hold no file")
    jobs = args.jobs or default_jobs(len(files))
    hidden = [args.source, *args.paths, *written_to, *([args.feedback] if args.feedback else [])]
    sandbox, notice = choose_sandbox(args.sandbox, hidden, own=own_work(args.paths, args.source))
    print(notice, file=err, flush=True)
    if jobs > 1:
        print(f"grading {len(files)} files, {jobs} at a time, OMP_NUM_THREADS="
              f"{threads_per_job(jobs)} per kernel", file=err, flush=True)
    journal = Journal(log_path) if log_path is not None else None

    finished: dict[int, object] = {}
    printing = [not args.json]
    shown = [0]  # the tables are printed in the order of the files: up to this index so far

    def show(result) -> None:
        if printing[0]:
            try:
                print_result(result, out)
            except (OSError, ValueError):  # a closed or broken stdout must not stop grading
                printing[0] = False

    def progress(index, result):
        finished[index] = result
        if journal is not None:
            journal.append(result)  # first: durable before anything else can fail
        if jobs > 1:
            print_progress(result, len(finished), len(files), err)
        while shown[0] in finished:
            show(finished[shown[0]])
            shown[0] += 1

    stop = Stop()
    interrupted = None
    remaining = []
    try:
        with stop.handling_signals():
            grade_files(
                files, args.source, cell_timeout=args.cell_timeout, timeout=args.timeout,
                progress=progress, sandbox=sandbox if sandbox else False,
                hidden=[*args.paths, *written_to], memory=args.memory, max_size=args.max_size,
                jobs=jobs, stop=stop,
            )
    except GradingInterrupted as stopped:
        interrupted, remaining = stopped.signum, stopped.remaining
    except KeyboardInterrupt:  # a second Ctrl-C while stopping
        interrupted = signal.SIGINT
        remaining = [path for index, path in enumerate(files) if index not in finished]
    finally:
        if journal is not None:
            journal.close()
    for index in sorted(finished):  # finished after one that was stopped: still shown, in order
        if index >= shown[0]:
            show(finished[index])
    results = [finished[index] for index in sorted(finished)]

    problems, csv_written = _write_outputs(args, results, csv_path, log_path, journal, err)
    if args.json:
        json.dump([result.to_dict() for result in results], out, indent=1)
        print(file=out, flush=True)
    else:
        print_summary(results, out)
        if csv_written:
            print(f"wrote {display_path(csv_path)}", file=out, flush=True)
    for problem in problems:
        print(f"course-grade: error: {problem}", file=err, flush=True)
    if interrupted is not None:
        _say_stopped(interrupted, remaining, files, len(results), err)
        return EXIT_SIGNAL_BASE + interrupted
    if problems:
        return EXIT_PARTLY_WRITTEN
    return EXIT_OK if all(result.graded for result in results) else EXIT_NOT_GRADED


def _write_outputs(args, results, csv_path, log_path, journal, err) -> tuple[list[str], bool]:
    """Write the CSV and the feedback pages; return what could not be written, in words, and
    whether the CSV was."""
    problems = []
    if journal is not None and journal.error:
        problems.append(
            f"the log {display_path(log_path)} holds only the first {journal.written} results "
            f"({journal.error})"
        )
    csv_written = False
    if csv_path is not None:
        try:
            write_csv(results, csv_path)
            csv_written = True
        except OSError as error:
            where = (f"; every result is in {display_path(log_path)}"
                     if journal is not None and not journal.error else "")
            why = error.strerror or error
            problems.append(f"could not write the CSV {display_path(csv_path)}: {why}{where}")
    if args.feedback:
        try:
            written = write_feedback(results, load_sources(args.source), args.feedback,
                                     args.feedback_format)
            print(f"wrote {len(written)} feedback pages to {display_path(args.feedback)}",
                  file=err, flush=True)
        except OSError as error:
            problems.append(f"could not write the feedback pages: {error.strerror or error}")
    return problems, csv_written


def _say_stopped(signum: int, remaining: list, files: list, kept: int, err) -> None:
    """The line a stopped grading ends with: the signal, what was kept, what was not graded."""
    name = signal.Signals(signum).name
    tail = files[len(files) - len(remaining):] == remaining
    which = ""
    if remaining:
        which = (f" (from {display_path(remaining[0])} on)" if tail
                 else f" (the first: {display_path(remaining[0])})")
    print(f"course-grade: stopped by {name}: graded and kept: {kept}; "
          f"not graded: {len(remaining)}{which}", file=err, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``course-grade`` command; returns the exit status (see the module's docstring).

    ``release``: 0 when written (or, with ``--check``, when up to date), 1 when ``--check``
    finds exercises out of date, 2 for malformed sources or a bad ``--student`` folder.
    ``grade``: 0, 1, 2, 3, or 128 + the signal number (130, 143). argparse exits with 2 on
    bad options.
    """
    for stream in (sys.stdout, sys.stderr):  # any text prints, whatever the terminal's encoding
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    args = _parser().parse_args(argv)
    out = sys.stdout
    try:
        if args.command == "release":
            return _release(args, out)
        if args.command == "feedback":
            return _feedback(args, out)
        if args.command == "gradebook":
            return _gradebook(args, out)
        return _grade(args, out)
    except (GradingError, SandboxError, ValueError, OSError) as error:
        said = error
        if isinstance(error, OSError) and error.strerror:  # never "[Errno 2] ..."
            where = f"{display_path(error.filename)}: " if error.filename else ""
            said = f"{where}{error.strerror}"
        print(f"course-grade: error: {said}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # before grading started: nothing to keep
        print("course-grade: interrupted before any submission was graded", file=sys.stderr)
        return EXIT_SIGNAL_BASE + signal.SIGINT
