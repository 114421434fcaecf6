"""Grading: find the submissions, grade each one, hand each result over as soon as it exists.

A bad submission never stops the grading of the others and never raises: it comes back with
``error`` set (not graded). Only malformed sources, bad arguments, an unusable sandbox that was
asked for, and a stop request (Ctrl-C, SIGTERM) end a run early. Several submissions may be
graded at once (``jobs``, see :mod:`course_grade.parallel`); results come back in the order of
the files, whatever order they finished in.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from pathlib import Path
from typing import Callable, Iterable

from .assemble import assemble, check_same_exercise, describe, match_source
from .execute import (
    DEFAULT_CELL_TIMEOUT,
    DEFAULT_TIMEOUT,
    PROBE_TIMEOUT,
    CellRun,
    Limits,
    execute_async,
)
from .notebook import (
    DEFAULT_MAX_SIZE,
    GradingError,
    SourceNotebook,
    first_line,
    is_protected,
    load_sources,
    read_submission,
)
from .parallel import check_jobs, default_jobs, run_jobs, threads_per_job
from .results import SubmissionResult, TestResult, display_path
from .sandbox import (
    DEFAULT_MEMORY,
    Sandbox,
    choose_sandbox,
    make_workdir,
    own_work,
    remove_workdir,
)
from .stop import GradingInterrupted, Stop


def _check_positive(name: str, value) -> None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")


def _resolve_sandbox(wanted: bool | None, hidden, own: bool) -> Sandbox | None:
    """:func:`choose_sandbox`, with a RuntimeWarning when the default falls back to no sandbox
    (a learner's own notebook only: anything else raises SandboxError)."""
    sandbox, notice = choose_sandbox(wanted, hidden, own=own)
    if sandbox is None and wanted is None:
        warnings.warn(notice, RuntimeWarning, stacklevel=3)
    return sandbox


def grade_submission(
    path: str | os.PathLike,
    sources: dict[str, SourceNotebook],
    *,
    cell_timeout: float = DEFAULT_CELL_TIMEOUT,
    timeout: float = DEFAULT_TIMEOUT,
    sandbox: bool | None | Sandbox = None,
    memory: int = DEFAULT_MEMORY,
    max_size: int = DEFAULT_MAX_SIZE,
    probe_timeout: float = PROBE_TIMEOUT,
    threads: int | None = None,
    stop: Stop | None = None,
) -> SubmissionResult:
    """Grade one submission file against ``sources`` (from :func:`course_grade.load_sources`).

    ``cell_timeout`` and ``timeout`` (the notebook, kernel start included) are seconds;
    ``memory`` is the kernel's address-space limit in bytes (0: none); ``max_size`` the largest
    file read, in bytes; ``probe_timeout`` the seconds an interrupted kernel gets to answer;
    ``threads`` the kernel's ``OMP_NUM_THREADS`` (None: the grader's, default 1);
    ``sandbox`` as in :func:`grade`. Never raises for a bad submission: a file that is a
    symbolic link, too large, not a notebook, of another exercise, or whose kernel cannot start
    comes back with ``error`` set and no points; deleted, moved or edited cells, errors in the
    learner's cells (out of memory included), time-outs and a stopped kernel are listed in
    ``issues``. Raises ValueError for a bad limit, SandboxError if a sandbox is required, or
    the file is not the learner's own (:func:`course_grade.sandbox.own_work`), and bubblewrap
    cannot be used, GradingInterrupted if ``stop`` is requested meanwhile.
    """
    from jupyter_core.utils import run_sync  # lazy: the grade extra, needed only to execute notebooks

    _check_positive("cell_timeout", cell_timeout)
    _check_positive("timeout", timeout)
    _check_positive("probe_timeout", probe_timeout)
    path = Path(path)
    if not isinstance(sandbox, Sandbox):
        folders = sorted({str(src.path.parent) for src in sources.values()})
        own = any(own_work([path], folder) for folder in folders)
        sandbox = _resolve_sandbox(sandbox, [*folders, path.parent], own)
    limits = Limits(float(cell_timeout), float(timeout), int(memory), float(probe_timeout),
                    threads)
    return run_sync(grade_submission_async)(path, sources, limits, sandbox or None, max_size, stop)


async def grade_submission_async(
    path: Path,
    sources: dict[str, SourceNotebook],
    limits: Limits,
    sandbox: Sandbox | None,
    max_size: int = DEFAULT_MAX_SIZE,
    stop: Stop | None = None,
) -> SubmissionResult:
    """:func:`grade_submission` on the running event loop, with checked ``limits`` and a
    decided ``sandbox`` (None: unsandboxed); what several jobs at once run."""
    result = SubmissionResult(submission=display_path(path))
    started = time.monotonic()
    runs: list[CellRun | None] = []
    try:
        if path.suffix != ".ipynb" and not path.is_symlink():
            if not path.exists():
                raise GradingError("no such file")
            raise GradingError(f"not a notebook (a .ipynb file), but {path.suffix or 'no suffix'}")
        submission = read_submission(path, max_size)
        source = match_source(path, submission, sources)
        result.source = source.name
        check_same_exercise(source, submission, sources)
        nb, index_of, result.issues = assemble(source, submission)
        protected = {index_of[cell.id] for cell in source.nb.cells if is_protected(cell)}
        workdir = make_workdir()
        try:
            # the learner's throwaway copy (plain JSON: nbformat's validator would log learner text)
            (workdir / "home" / source.name).write_text(json.dumps(nb, indent=1), encoding="utf-8")
            runs, notes = await execute_async(nb, protected, limits, sandbox, workdir, stop)
            result.issues += notes
        except GradingInterrupted:
            raise
        except Exception as error:  # the kernel could not start, or the connection broke
            why = f"{type(error).__name__}: {first_line(str(error))}"
            raise GradingError(f"could not execute it: {why}") from None
        finally:
            remove_workdir(workdir)
    except GradingError as error:
        result.error = str(error)
    except GradingInterrupted:
        raise
    except Exception as error:  # a submission must never stop the grading of the others
        result.error = f"could not grade it: {type(error).__name__}: {first_line(str(error))}"
    result.seconds = time.monotonic() - started
    if result.error is not None:
        result.issues = []
        return result.cleaned()

    test_index = {index_of[test.cell_id] for test in source.tests}
    for index, run in enumerate(runs):
        if run is not None and run.status in ("error", "timeout") and index not in test_index:
            result.issues.append(f"{describe(nb.cells[index])}: {run.message}")
    for test in source.tests:
        run = runs[index_of[test.cell_id]] or CellRun("not run", "not run")
        passed = run.status == "ok"
        result.tests.append(
            TestResult(
                grade_id=test.grade_id,
                points=test.points if passed else 0.0,
                max_points=test.points,
                status="pass" if passed else ("not run" if run.status == "not run" else "fail"),
                message=run.message,
            )
        )
    return result.cleaned()


def find_submissions(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Expand ``paths`` into submission files: a file stays, a folder gives all its files.

    Folders are searched recursively, in sorted order, skipping hidden files and folders and
    ``.ipynb_checkpoints``. Symbolic links inside a folder are listed but never followed (they
    are reported as not graded); a folder given by name is searched even if it is a link. A path
    that does not exist is kept (it is reported as not graded).
    """
    found: list[Path] = []

    def walk(folder: Path) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except OSError:
            found.append(folder)  # unreadable folder: reported when graded
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            item = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                walk(item)
            else:
                found.append(item)

    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            walk(path)
        else:
            found.append(path)
    return found


def submission_files(
    paths: Iterable[str | os.PathLike], exclude: Iterable[str | os.PathLike] = ()
) -> list[Path]:
    """The files :func:`grade` grades, in its order: :func:`find_submissions` of ``paths``
    without the files in ``exclude`` (e.g. the CSV being written)."""
    skip = {Path(path).resolve() for path in exclude}
    return [path for path in find_submissions(paths) if path.resolve() not in skip]


def grade(
    paths: Iterable[str | os.PathLike],
    source: str | os.PathLike = "solutions",
    *,
    cell_timeout: float = DEFAULT_CELL_TIMEOUT,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Callable[[SubmissionResult], None] | None = None,
    exclude: Iterable[str | os.PathLike] = (),
    sandbox: bool | None | Sandbox = None,
    memory: int = DEFAULT_MEMORY,
    max_size: int = DEFAULT_MAX_SIZE,
    jobs: int | None = 1,
    stop: Stop | None = None,
) -> list[SubmissionResult]:
    """Grade every submission in ``paths`` (files or folders) against the notebooks in ``source``.

    ``progress``, if given, is called with each SubmissionResult as soon as it is ready (write it
    somewhere durable there); files in ``exclude`` (e.g. the CSV being written) are skipped.
    ``jobs`` submissions are graded at once (None: :func:`course_grade.parallel.default_jobs`),
    each kernel with ``OMP_NUM_THREADS`` = the grader's budget / ``jobs``; the results come back
    in the order of the files (folders sorted by name).
    ``sandbox``: a Sandbox, True (required), False (never: you accept the risk) or None (where
    bubblewrap works; without it only a learner's own notebook runs, unsandboxed: see
    :func:`course_grade.sandbox.choose_sandbox`); ``memory`` (bytes) and ``max_size`` (bytes) as
    in :func:`grade_submission`. Raises GradingError if the sources are malformed (see
    :func:`course_grade.load_sources`) or ``paths`` names no file, ValueError for a bad time
    limit or job count, SandboxError before anything runs if bubblewrap cannot be used and a
    sandbox is required, or ``sandbox`` is None and the files are a class (not one learner's
    own notebook, :func:`course_grade.sandbox.own_work`),
    GradingInterrupted (with the results finished so far) when ``stop`` is requested; a bad
    submission never raises.
    """
    paths = list(paths)
    files = submission_files(paths, exclude)
    if not files:
        load_sources(source)  # malformed sources first
        raise GradingError("no submissions: the paths given hold no file")
    if not isinstance(sandbox, Sandbox):  # one's own work is judged on the paths as given
        _check_positive("cell_timeout", cell_timeout)  # bad arguments first, as grade_files
        _check_positive("timeout", timeout)
        if jobs is not None:
            check_jobs(jobs)
        load_sources(source)  # malformed sources first
        parents = sorted({str(path.parent) for path in files})
        sandbox = _resolve_sandbox(sandbox, [source, *paths, *exclude, *parents],
                                   own_work(paths, source)) or False
    return grade_files(
        files, source, cell_timeout=cell_timeout, timeout=timeout,
        progress=None if progress is None else (lambda index, result: progress(result)),
        sandbox=sandbox, hidden=[*paths, *exclude], memory=memory, max_size=max_size,
        jobs=jobs, stop=stop,
    )


def grade_files(
    files: list[Path],
    source: str | os.PathLike = "solutions",
    *,
    cell_timeout: float = DEFAULT_CELL_TIMEOUT,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Callable[[int, SubmissionResult], None] | None = None,
    sandbox: bool | None | Sandbox = None,
    hidden: Iterable[str | os.PathLike] = (),
    memory: int = DEFAULT_MEMORY,
    max_size: int = DEFAULT_MAX_SIZE,
    jobs: int | None = 1,
    stop: Stop | None = None,
) -> list[SubmissionResult]:
    """:func:`grade` of a list of files already found (see :func:`submission_files`; folders
    are not searched again): ``progress(index, result)`` gets each result's index in ``files``
    as it finishes; ``hidden`` are more paths the sandbox must not show (the class folder, the
    CSV). Same results, errors and options as :func:`grade`."""
    from jupyter_core.utils import run_sync  # lazy: the grade extra, needed only to execute notebooks

    _check_positive("cell_timeout", cell_timeout)
    _check_positive("timeout", timeout)
    sources = load_sources(source)
    files = [Path(path) for path in files]
    if not files:
        raise GradingError("no submissions: the paths given hold no file")
    jobs = default_jobs(len(files)) if jobs is None else check_jobs(jobs)
    if not isinstance(sandbox, Sandbox):
        parents = sorted({str(path.parent) for path in files})
        sandbox = _resolve_sandbox(sandbox, [source, *hidden, *parents],
                                   own_work(files, source)) or None
    limits = Limits(float(cell_timeout), float(timeout), int(memory), PROBE_TIMEOUT,
                    threads_per_job(jobs))

    def grade_one(path: Path):
        return grade_submission_async(path, sources, limits, sandbox, max_size, stop)

    return run_sync(run_jobs)(files, grade_one, jobs, progress, stop)
