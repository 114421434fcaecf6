"""Release and autograde the course's graded notebooks (a small module on nbformat + nbclient).

A graded notebook has one source, ``solutions/NN_name.ipynb``, written with nbgrader's conventions:

* solution code sits between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` lines;
* a test cell carries the cell metadata
  ``nbgrader: {grade: true, grade_id: "...", points: N, locked: true, solution: false}``
  and may hold hidden tests between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS``;
* other cells with ``nbgrader: {locked: true}`` are read-only (given code the tests rely on).

``release`` writes the learner's copy, ``exercises/NN_name.ipynb``: every solution region becomes
``# YOUR CODE HERE`` + ``raise NotImplementedError()`` at the region's indentation, hidden tests
are removed, outputs and execution counts are cleared, cell ids are kept, read-only cells are
marked non-editable and non-deletable, and the notebook metadata records its source
(``course_grade.source``).

``grade`` scores submissions. For each one it rebuilds the notebook to execute from the source's
cell order: the source's own copy of every test and read-only cell (matched by cell id, hidden
tests included: a learner cannot edit or delete a test away), the learner's version of every other
cell, the learner's own extra cells after the cell they followed, and the released version of any
cell the learner deleted. It executes that notebook cell by cell in a fresh kernel (the current
environment's Python, ``COURSE_SIZE=smoke`` unless set, a scratch working directory) with a
per-cell and a per-notebook time limit, and gives each test cell its points when it runs without
an error. Every question is scored independently: execution goes on after a failing cell, a cell
that runs too long is interrupted, and grading goes on with the next submission whatever happens.

Learner code is *not* sandboxed: it runs with the grader's permissions (see docs/instructors.md).

Command line (the ``course-grade`` console script)::

    course-grade release [--source solutions] [--dest exercises] [--check]
    course-grade grade SUBMISSION_OR_FOLDER... [--source solutions] [--csv FILE] [--json]
                       [--cell-timeout S] [--timeout S]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

try:
    import nbformat
    from nbformat import NotebookNode
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "course_utils.grading needs nbformat and nbclient: pip install 'course_utils[grade]'"
    ) from error

__all__ = [
    "BEGIN_SOLUTION",
    "END_SOLUTION",
    "BEGIN_HIDDEN_TESTS",
    "END_HIDDEN_TESTS",
    "GradingError",
    "SourceNotebook",
    "TestResult",
    "SubmissionResult",
    "clear_solutions",
    "remove_hidden_tests",
    "load_source",
    "load_sources",
    "release_notebook",
    "release",
    "check_release",
    "find_submissions",
    "grade_submission",
    "grade",
    "results_table",
    "summary_table",
    "write_csv",
    "main",
]

BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"
BEGIN_HIDDEN_TESTS = "### BEGIN HIDDEN TESTS"
END_HIDDEN_TESTS = "### END HIDDEN TESTS"
CODE_STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
MARKDOWN_STUB = ("YOUR ANSWER HERE",)

METADATA_KEY = "course_grade"  # notebook metadata written at release: {"source": "NN_name.ipynb"}
KERNEL_NAME = "python3"  # resolved to the Python running the grader (see _kernel_manager)
DEFAULT_CELL_TIMEOUT = 120.0  # seconds per cell
DEFAULT_TIMEOUT = 600.0  # seconds per notebook, kernel start-up included
_PROBE_TIMEOUT = 10.0  # seconds an interrupted kernel gets to answer again

# Metadata that nbstripout removes by default: released notebooks must be nbstripout-clean.
_NB_METADATA_TO_DROP = ("signature", "widgets")
_CELL_METADATA_TO_DROP = (
    "collapsed",
    "ExecuteTime",
    "execution",
    "heading_collapsed",
    "hidden",
    "scrolled",
)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class GradingError(ValueError):
    """A graded notebook's source is malformed, or a path does not hold what it should."""


# --------------------------------------------------------------------------- source format


def _replace_regions(
    text: str, begin: str, end: str, stub: Sequence[str], where: str
) -> tuple[str, int]:
    """Replace each ``begin``...``end`` region of ``text`` (marker lines included) by ``stub``.

    The stub lines get the indentation of the region's ``begin`` line. Returns the new text and
    the number of regions. Raises GradingError on a nested, unclosed or unopened region.
    """
    out: list[str] = []
    regions = 0
    start_line = None
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        stripped = line.strip()
        if stripped.startswith(begin):
            if start_line is not None:
                raise GradingError(
                    f"{where}: line {number} opens '{begin}' inside the region opened "
                    f"on line {start_line}"
                )
            start_line = number
            indent = line[: len(line) - len(line.lstrip())]
            out.extend(f"{indent}{stub_line}\n" for stub_line in stub)
            regions += 1
        elif stripped.startswith(end):
            if start_line is None:
                raise GradingError(f"{where}: line {number} has '{end}' without '{begin}'")
            start_line = None
        elif start_line is None:
            out.append(line)
    if start_line is not None:
        raise GradingError(f"{where}: '{begin}' on line {start_line} is never closed by '{end}'")
    new = "".join(out)
    if regions and not text.endswith("\n"):
        new = new.removesuffix("\n")
    return new, regions


def clear_solutions(source: str, *, markdown: bool = False, where: str = "cell") -> str:
    """Return ``source`` with every solution region replaced by the learner's stub.

    Code: ``# YOUR CODE HERE`` + ``raise NotImplementedError()``; markdown (``markdown=True``):
    ``YOUR ANSWER HERE``; both at the indentation of the ``### BEGIN SOLUTION`` line.
    Raises GradingError (naming ``where``) if the markers are unbalanced.
    """
    stub = MARKDOWN_STUB if markdown else CODE_STUB
    return _replace_regions(source, BEGIN_SOLUTION, END_SOLUTION, stub, where)[0]


def remove_hidden_tests(source: str, *, where: str = "cell") -> str:
    """Return ``source`` without its ``### BEGIN/END HIDDEN TESTS`` regions (markers included).

    Raises GradingError (naming ``where``) if the markers are unbalanced.
    """
    return _replace_regions(source, BEGIN_HIDDEN_TESTS, END_HIDDEN_TESTS, (), where)[0]


def _nbgrader(cell: NotebookNode) -> dict:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta if isinstance(meta, dict) else {}


def _is_test(cell: NotebookNode) -> bool:
    return bool(_nbgrader(cell).get("grade"))


def _is_protected(cell: NotebookNode) -> bool:
    """Test cells and read-only cells: the grader always executes the source's copy."""
    meta = _nbgrader(cell)
    return bool(meta.get("grade") or meta.get("locked"))


@dataclass(frozen=True)
class TestCell:
    """One test cell of a source notebook: ``points`` if it runs without an error."""

    cell_id: str
    grade_id: str
    points: float


@dataclass
class SourceNotebook:
    """A validated graded notebook from solutions/ (see :func:`load_source`)."""

    path: Path
    nb: NotebookNode
    tests: list[TestCell]

    @property
    def name(self) -> str:
        """The file name, e.g. ``01_loss_scaling.ipynb``: what submissions are matched by."""
        return self.path.name

    @property
    def max_points(self) -> float:
        """Total points of the notebook's test cells."""
        return float(sum(test.points for test in self.tests))

    def released(self) -> NotebookNode:
        """The learner's version of this notebook (see :func:`release_notebook`)."""
        return release_notebook(self.nb, self.name)


def _raw_cell_ids(text: str) -> list:
    """The cell ids as stored in the file (nbformat's reader silently repairs them)."""
    raw = json.loads(text)
    cells = raw.get("cells") if isinstance(raw, dict) else None
    return [c.get("id") if isinstance(c, dict) else None for c in cells or []]


def _read_notebook(path: Path) -> NotebookNode:
    text = Path(path).read_text(encoding="utf-8")
    with warnings.catch_warnings():  # nbformat warns about (and repairs) missing/duplicate ids
        warnings.simplefilter("ignore")
        nb = nbformat.reads(text, as_version=nbformat.NO_CONVERT)
    if nb.get("nbformat") != 4:
        nb = nbformat.convert(nb, 4)
    if not isinstance(nb.get("cells"), list):
        raise ValueError("it has no list of cells")
    for index, cell in enumerate(nb.cells, start=1):
        if not isinstance(cell, dict) or "cell_type" not in cell or "source" not in cell:
            raise ValueError(f"cell {index} has no cell_type or source")
    return nb


def load_source(path: str | os.PathLike) -> SourceNotebook:
    """Read and check one source notebook (``solutions/NN_name.ipynb``).

    Checks that every cell has a unique id, that solution and hidden-test markers are balanced,
    that every test cell is a code cell with a ``grade_id`` (unique in the notebook), ``points``
    (a number >= 0) and no solution region, and that there is at least one test cell.
    Raises GradingError with the notebook, the cell and the problem otherwise.
    """
    path = Path(path)
    try:
        nb = _read_notebook(path)
        raw_ids = _raw_cell_ids(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GradingError(f"{path}: no such file") from None
    except Exception as error:
        raise GradingError(f"{path}: not a readable notebook ({_first_line(str(error))})") from None
    ids: set[str] = set()
    tests: list[TestCell] = []
    grade_ids: set[str] = set()
    for index, (cell, cell_id) in enumerate(zip(nb.cells, raw_ids), start=1):
        where = f"{path}, cell {index} (id {cell_id!r})"
        if not cell_id or not isinstance(cell_id, str):
            raise GradingError(
                f"{path}, cell {index}: no cell id; the grader matches cells by id "
                "(save the notebook with nbformat >= 4.5, e.g. any current Jupyter)"
            )
        if cell_id in ids:
            raise GradingError(f"{where}: the cell id is used twice")
        ids.add(cell_id)
        text = _text(cell.source)
        clear_solutions(text, markdown=cell.cell_type == "markdown", where=where)
        remove_hidden_tests(text, where=where)
        meta = _nbgrader(cell)
        if _is_protected(cell) and (meta.get("solution") or BEGIN_SOLUTION in text):
            raise GradingError(
                f"{where}: a test or read-only cell (nbgrader.grade or nbgrader.locked) cannot "
                "hold a solution: the grader replaces it by the source's copy"
            )
        if not _is_test(cell):
            continue
        if cell.cell_type != "code":
            raise GradingError(f"{where}: a test cell (nbgrader.grade: true) must be a code cell")
        grade_id = meta.get("grade_id")
        if not isinstance(grade_id, str) or not grade_id.strip():
            raise GradingError(f"{where}: a test cell needs nbgrader.grade_id (a string)")
        if grade_id in grade_ids:
            raise GradingError(f"{where}: grade_id {grade_id!r} is used twice")
        grade_ids.add(grade_id)
        points = meta.get("points")
        if isinstance(points, bool) or not isinstance(points, (int, float)) or not points >= 0:
            raise GradingError(f"{where}: nbgrader.points must be a number >= 0, not {points!r}")
        tests.append(TestCell(cell_id=cell_id, grade_id=grade_id, points=float(points)))
    if not tests:
        raise GradingError(f"{path}: no test cells (cell metadata nbgrader.grade: true)")
    return SourceNotebook(path=path, nb=nb, tests=tests)


def _notebooks_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.ipynb") if p.is_file())


def load_sources(source_dir: str | os.PathLike = "solutions") -> dict[str, SourceNotebook]:
    """Load and check every ``*.ipynb`` in ``source_dir``, keyed by file name.

    Raises GradingError if the folder does not exist or holds no notebook, if a notebook is
    malformed (see :func:`load_source`), or if a grade_id is used by two notebooks (the CSV has
    one column per grade_id).
    """
    folder = Path(source_dir)
    if not folder.is_dir():
        raise GradingError(f"source folder {folder} does not exist")
    paths = _notebooks_in(folder)
    if not paths:
        raise GradingError(f"source folder {folder} holds no .ipynb notebook")
    sources = {path.name: load_source(path) for path in paths}
    owner: dict[str, str] = {}
    for name, source in sources.items():
        for test in source.tests:
            if test.grade_id in owner:
                raise GradingError(
                    f"grade_id {test.grade_id!r} is used by both {owner[test.grade_id]} and {name}"
                )
            owner[test.grade_id] = name
    return sources


# --------------------------------------------------------------------------- release


def _text(source: Any) -> str:
    return "".join(source) if isinstance(source, list) else str(source)


def release_notebook(nb: NotebookNode, name: str) -> NotebookNode:
    """Return the learner's copy of source notebook ``nb`` (``name`` is its file name).

    Solution regions become the stub, hidden tests disappear, outputs, execution counts and the
    metadata that nbstripout strips are removed, cell ids are kept, protected cells (tests and
    read-only cells) get ``editable: false`` and ``deletable: false``, and the notebook metadata
    records ``course_grade.source = name``. ``nb`` is not modified.
    Raises GradingError if a cell's markers are unbalanced.
    """
    out = copy.deepcopy(nb)
    for key in _NB_METADATA_TO_DROP:
        out.metadata.pop(key, None)
    out.metadata[METADATA_KEY] = {"source": name}
    for index, cell in enumerate(out.cells, start=1):
        where = f"{name}, cell {index} (id {cell.get('id')!r})"
        text = _text(cell.source)
        text = clear_solutions(text, markdown=cell.cell_type == "markdown", where=where)
        if _is_test(cell):
            text = remove_hidden_tests(text, where=where)
        cell.source = text
        for key in _CELL_METADATA_TO_DROP:
            cell.metadata.pop(key, None)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        else:
            cell.pop("outputs", None)
            cell.pop("execution_count", None)
        if _is_protected(cell):
            cell.metadata["editable"] = False
            cell.metadata["deletable"] = False
    return out


def _dumps(nb: NotebookNode) -> str:
    # nbformat.write's own layout (indent 1, sorted keys, trailing newline), as nbstripout writes.
    return nbformat.writes(nb, version=4) + "\n"


def _planned_release(source_dir: str | os.PathLike, dest_dir: str | os.PathLike):
    sources = load_sources(source_dir)
    dest = Path(dest_dir)
    planned = {dest / name: _dumps(src.released()) for name, src in sources.items()}
    orphans = [p for p in (_notebooks_in(dest) if dest.is_dir() else []) if p not in planned]
    return planned, orphans


def check_release(
    source_dir: str | os.PathLike = "solutions", dest_dir: str | os.PathLike = "exercises"
) -> list[str]:
    """Say how ``dest_dir`` differs from a fresh release of ``source_dir``; [] if up to date.

    Each entry is one problem: a missing or stale exercise, or an exercise without a source.
    Raises GradingError if the sources are malformed (see :func:`load_sources`).
    """
    planned, orphans = _planned_release(source_dir, dest_dir)
    problems = []
    for path, text in planned.items():
        if not path.exists():
            problems.append(f"{path} is missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{path} is out of date with {Path(source_dir) / path.name}")
    problems += [f"{path} has no source in {source_dir}/ (delete it by hand)" for path in orphans]
    return problems


def release(
    source_dir: str | os.PathLike = "solutions", dest_dir: str | os.PathLike = "exercises"
) -> list[Path]:
    """Regenerate ``dest_dir`` from ``source_dir``; return the files written (changed ones only).

    Creates ``dest_dir`` if needed. Never deletes: an exercise without a source is reported by
    :func:`check_release`. Raises GradingError if the sources are malformed.
    """
    planned, _ = _planned_release(source_dir, dest_dir)
    Path(dest_dir).mkdir(parents=True, exist_ok=True)
    written = []
    for path, text in planned.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written


# --------------------------------------------------------------------------- results


@dataclass
class TestResult:
    """One test cell of one submission: ``points`` of ``max_points``, status and first message.

    ``status`` is ``"pass"``, ``"fail"`` (the cell raised or timed out) or ``"not run"``
    (an earlier cell timed out beyond recovery, the kernel died, or the notebook ran out of time).
    """

    grade_id: str
    points: float
    max_points: float
    status: str
    message: str = ""


@dataclass
class SubmissionResult:
    """The grade of one submission (a file), or why it could not be graded (``error``)."""

    submission: str
    source: str | None = None
    tests: list[TestResult] = field(default_factory=list)
    issues: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0

    @property
    def graded(self) -> bool:
        """True if the submission was executed and scored (possibly with issues)."""
        return self.error is None

    @property
    def score(self) -> float:
        """Points earned (0 if not graded)."""
        return float(sum(test.points for test in self.tests))

    @property
    def max_score(self) -> float:
        """Points available in the matched source (0 if none matched)."""
        return float(sum(test.max_points for test in self.tests))

    def to_dict(self) -> dict:
        """A JSON-ready dict: the fields plus ``graded``, ``score`` and ``max_score``."""
        data = asdict(self)
        data.update(graded=self.graded, score=self.score, max_score=self.max_score)
        return data


# --------------------------------------------------------------------------- assembling


def _longest_increasing(positions: list[int]) -> set[int]:
    """Indices (into ``positions``) of one longest increasing subsequence."""
    if not positions:
        return set()
    best_end = [1] * len(positions)
    previous = [-1] * len(positions)
    for i, value in enumerate(positions):
        for j in range(i):
            if positions[j] < value and best_end[j] + 1 > best_end[i]:
                best_end[i], previous[i] = best_end[j] + 1, j
    i = max(range(len(positions)), key=best_end.__getitem__)
    keep = set()
    while i != -1:
        keep.add(i)
        i = previous[i]
    return keep


def _describe(cell: NotebookNode) -> str:
    meta = _nbgrader(cell)
    if meta.get("grade"):
        return f"test {meta.get('grade_id')!r}"
    first = _first_line(_text(cell.source))
    first = first[:40] + ("..." if len(first) > 40 else "")
    return f"{cell.cell_type} cell {cell.get('id')!r}" + (f' ("{first}")' if first else "")


def _assemble(
    source: SourceNotebook, submission: NotebookNode
) -> tuple[NotebookNode, dict[str, int], list[str]]:
    """Build the notebook to execute; return it, the index of each source cell in it, and issues.

    Raises GradingError if no cell of the submission matches a cell of the source.
    """
    src_cells = source.nb.cells
    released = source.released().cells
    position = {cell.id: i for i, cell in enumerate(src_cells)}
    by_grade_id = {
        _nbgrader(cell)["grade_id"]: cell.id
        for cell in src_cells
        if isinstance(_nbgrader(cell).get("grade_id"), str)
    }
    learner: dict[str, NotebookNode] = {}
    extra: dict[str | None, list[NotebookNode]] = {}
    order: list[str] = []
    current: str | None = None
    for cell in submission.cells:
        key = cell.get("id")
        if key not in position:  # notebooks saved without ids: fall back on nbgrader's grade_id
            key = by_grade_id.get(_nbgrader(cell).get("grade_id"))
        if key in position and key not in learner:
            learner[key] = cell
            order.append(key)
            current = key
        else:  # the learner's own cell (or a duplicate id): it runs after the cell it followed
            extra.setdefault(current, []).append(cell)
    if not learner:
        raise GradingError(
            f"none of its cells match {source.name} (by cell id): "
            f"was it made from exercises/{source.name}?"
        )

    cells = list(extra.get(None, []))
    index_of: dict[str, int] = {}
    restored, replaced = [], []
    for src, rel in zip(src_cells, released):
        mine = learner.get(src.id)
        if mine is None:
            restored.append(_describe(src))
        if _is_protected(src):
            cell = copy.deepcopy(src)
            if mine is not None and (
                _text(mine.source) not in (_text(rel.source), _text(src.source))
                or mine.cell_type != rel.cell_type
            ):
                replaced.append(_describe(src))
        elif mine is not None:
            cell = copy.deepcopy(mine)
        else:
            cell = copy.deepcopy(rel)
        index_of[src.id] = len(cells)
        cells.append(cell)
        cells.extend(extra.get(src.id, []))

    issues = []
    if restored:
        issues.append(f"deleted cells put back from the source: {', '.join(restored)}")
    moved_keep = _longest_increasing([position[key] for key in order])
    moved = [key for i, key in enumerate(order) if i not in moved_keep]
    if moved:
        issues.append(
            "cells moved out of the original order (graded in the original order): "
            + ", ".join(_describe(src_cells[position[key]]) for key in moved)
        )
    if replaced:
        issues.append(
            "test or read-only cells that differ from the source (edited, or from an older "
            f"release) were replaced by the source's copy: {', '.join(replaced)}"
        )

    for cell in cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    nb = copy.deepcopy(submission)
    nb.cells = cells
    return nb, index_of, issues


# --------------------------------------------------------------------------- executing


@dataclass
class _CellRun:
    status: str  # "ok", "error", "timeout", "not run"
    message: str = ""


def _first_line(text: str) -> str:
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "")


def _failure_line(content: dict) -> str:
    """``Name: first line of the message``; for a bare exception, the line that raised it."""
    ename = content.get("ename") or "Error"
    evalue = _first_line(content.get("evalue", ""))
    if evalue:
        return f"{ename}: {evalue}"
    if ename == "NotImplementedError":
        return "NotImplementedError: not implemented yet (a '# YOUR CODE HERE' region still raises)"
    frames = [_ANSI.sub("", frame) for frame in content.get("traceback", [])]
    for frame in reversed(frames):
        for line in frame.splitlines():
            match = re.match(r"^\s*-+>\s*(\d+)\s+(.*\S)", line)
            if match:
                return f"{ename} at line {match.group(1)}: {match.group(2)}"
    return ename


def _kernel_manager():
    """An AsyncKernelManager whose "python3" is always the Python running the grader."""
    import ipykernel.kernelspec
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    class CurrentEnvKernelSpecManager(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            if kernel_name == KERNEL_NAME:
                return self.kernel_spec_class(
                    resource_dir=ipykernel.kernelspec.RESOURCES,
                    **ipykernel.kernelspec.get_kernel_dict(),
                )
            return super().get_kernel_spec(kernel_name)

    return AsyncKernelManager(
        kernel_name=KERNEL_NAME, kernel_spec_manager=CurrentEnvKernelSpecManager()
    )


def _kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("COURSE_SIZE", "smoke")
    # One thread per kernel: small graded notebooks run no slower, and far faster on a busy machine.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # quiets debugpy's frozen-module warning
    return env


async def _answers_again(client, seconds: float) -> bool:
    """After an interrupt: does the kernel run a trivial request within ``seconds``?"""
    from queue import Empty

    from jupyter_core.utils import ensure_async

    msg_id = await ensure_async(client.kc.execute("pass", store_history=False))
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        try:
            msg = await ensure_async(client.kc.shell_channel.get_msg(timeout=left))
        except Empty:
            return False
        if msg.get("parent_header", {}).get("msg_id") == msg_id:
            return True
    return False


async def _async_execute(
    nb: NotebookNode, cell_timeout: float, timeout: float, cwd: str
) -> list[_CellRun | None]:
    from jupyter_core.utils import ensure_async
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    deadline = time.monotonic() + timeout
    runs: list[_CellRun | None] = [None] * len(nb.cells)
    replies: dict[int, dict] = {}

    def on_cell_executed(cell, cell_index, execute_reply):
        replies[cell_index] = execute_reply

    limit = [cell_timeout]
    client = NotebookClient(
        nb,
        km=_kernel_manager(),
        kernel_name=KERNEL_NAME,
        timeout_func=lambda cell: limit[0],
        allow_errors=True,  # every cell runs, whatever happened before: questions score alone
        interrupt_on_timeout=False,  # we interrupt ourselves, then check the kernel answers
        shutdown_kernel="immediate",
        startup_timeout=max(1, int(min(60.0, timeout))),
        record_timing=False,
        on_cell_executed=on_cell_executed,
    )
    stop = ""
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}  # the kernel's own logs
    async with client.async_setup_kernel(cleanup_kc=True, env=_kernel_env(), cwd=cwd, **quiet):
        count = 0
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            if not stop and deadline - time.monotonic() <= 0:
                stop = f"not run: the notebook time limit ({timeout:g} s) was reached"
            if stop:
                runs[index] = _CellRun("not run", stop)
                continue
            limit[0] = min(cell_timeout, deadline - time.monotonic())
            count += 1
            try:
                await client.async_execute_cell(cell, index, execution_count=count)
            except CellTimeoutError:
                which = "cell" if limit[0] == cell_timeout else "notebook"
                runs[index] = _CellRun("timeout", f"timed out after {limit[0]:.3g} s ({which} limit)")
                await ensure_async(client.km.interrupt_kernel())
                left = deadline - time.monotonic()
                if left <= 0:
                    stop = f"not run: the notebook time limit ({timeout:g} s) was reached"
                elif not await _answers_again(client, min(_PROBE_TIMEOUT, left)):
                    stop = "not run: the kernel did not stop after a time-out and was killed"
                continue
            except DeadKernelError:
                runs[index] = _CellRun(
                    "error", "the kernel died (os._exit, a crash, or out of memory)"
                )
                stop = "not run: the kernel died in an earlier cell"
                continue
            content = (replies.pop(index, None) or {}).get("content", {})
            if content.get("status", "ok") == "ok":
                runs[index] = _CellRun("ok")
            elif content.get("status") == "error":
                runs[index] = _CellRun("error", _failure_line(content))
            else:
                runs[index] = _CellRun("error", f"execution {content.get('status')}")
    if getattr(client, "_async_cleanup_kernel_future", None) is not None:
        raise KeyboardInterrupt  # nbclient caught SIGINT/SIGTERM to kill the kernel: stop here
    return runs


def _execute(nb: NotebookNode, cell_timeout: float, timeout: float) -> list[_CellRun | None]:
    from jupyter_core.utils import run_sync

    with tempfile.TemporaryDirectory(prefix="course-grade-", ignore_cleanup_errors=True) as cwd:
        return run_sync(_async_execute)(nb, cell_timeout, timeout, cwd)


# --------------------------------------------------------------------------- grading


def _match_source(path: Path, nb: NotebookNode, sources: dict[str, SourceNotebook]):
    named = (nb.metadata.get(METADATA_KEY) or {}).get("source")
    if isinstance(named, str) and named in sources:
        return sources[named]
    if path.name in sources:
        return sources[path.name]
    stems = [src for name, src in sources.items() if Path(name).stem in path.stem]
    if len(stems) == 1:
        return stems[0]
    raise GradingError(
        "cannot tell which graded notebook this is: no course_grade metadata and the file name "
        f"does not contain exactly one of {', '.join(sorted(sources))}"
    )


def grade_submission(
    path: str | os.PathLike,
    sources: dict[str, SourceNotebook],
    *,
    cell_timeout: float = DEFAULT_CELL_TIMEOUT,
    timeout: float = DEFAULT_TIMEOUT,
) -> SubmissionResult:
    """Grade one submission file against ``sources`` (from :func:`load_sources`).

    Never raises for a bad submission: a file that is not a notebook, matches no source, or
    whose kernel cannot start comes back with ``error`` set and no points; deleted, moved or
    edited cells, errors in the learner's cells and time-outs are listed in ``issues``.
    Raises ValueError if a time limit is not a positive number.
    """
    for name, value in (("cell_timeout", cell_timeout), ("timeout", timeout)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
    path = Path(path)
    result = SubmissionResult(submission=str(path))
    started = time.monotonic()
    try:
        if not path.is_file():
            raise GradingError("no such file")
        if path.suffix != ".ipynb":
            raise GradingError(f"not a notebook (a .ipynb file), but {path.suffix or 'no suffix'}")
        try:
            submission = _read_notebook(path)
        except Exception as error:
            raise GradingError(f"not a readable notebook: {_first_line(str(error))}") from None
        source = _match_source(path, submission, sources)
        result.source = source.name
        nb, index_of, result.issues = _assemble(source, submission)
        try:
            runs = _execute(nb, float(cell_timeout), float(timeout))
        except Exception as error:  # the kernel could not start, or the connection broke
            raise GradingError(
                f"could not execute it: {type(error).__name__}: {_first_line(str(error))}"
            ) from None
    except GradingError as error:
        result.error = str(error)
    except Exception as error:  # a submission must never stop the grading of the others
        result.error = f"could not grade it: {type(error).__name__}: {_first_line(str(error))}"
    if result.error is not None:
        result.seconds = time.monotonic() - started
        return result

    test_index = {index_of[test.cell_id] for test in source.tests}
    for index, run in enumerate(runs):
        if run is not None and run.status in ("error", "timeout") and index not in test_index:
            result.issues.append(f"{_describe(nb.cells[index])}: {run.message}")
    for test in source.tests:
        run = runs[index_of[test.cell_id]] or _CellRun("not run", "not run")
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
    result.seconds = time.monotonic() - started
    return result


def find_submissions(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Expand ``paths`` into submission files: a file stays, a folder gives all its files.

    Folders are searched recursively, in sorted order, skipping hidden files and folders and
    ``.ipynb_checkpoints``. A path that does not exist is kept (it is reported as ungradable).
    """
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            found.append(path)
            continue
        for item in sorted(path.rglob("*")):
            parts = item.relative_to(path).parts
            if item.is_file() and not any(p.startswith(".") for p in parts):
                found.append(item)
    return found


def grade(
    paths: Iterable[str | os.PathLike],
    source: str | os.PathLike = "solutions",
    *,
    cell_timeout: float = DEFAULT_CELL_TIMEOUT,
    timeout: float = DEFAULT_TIMEOUT,
    progress=None,
    exclude: Iterable[str | os.PathLike] = (),
) -> list[SubmissionResult]:
    """Grade every submission in ``paths`` (files or folders) against the notebooks in ``source``.

    ``progress``, if given, is called with each SubmissionResult as soon as it is ready; files
    in ``exclude`` (e.g. the CSV being written) are skipped. Raises GradingError if the sources
    are malformed (see :func:`load_sources`) or ``paths`` names no file, ValueError for a bad
    time limit; a bad submission never raises.
    """
    sources = load_sources(source)
    skip = {Path(path).resolve() for path in exclude}
    files = [path for path in find_submissions(paths) if path.resolve() not in skip]
    if not files:
        raise GradingError("no submissions: the paths given hold no file")
    results = []
    for path in files:
        result = grade_submission(path, sources, cell_timeout=cell_timeout, timeout=timeout)
        results.append(result)
        if progress is not None:
            progress(result)
    return results


# --------------------------------------------------------------------------- reports


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else round(value, 2)


def results_table(result: SubmissionResult, width: int = 200):
    """One row per test cell of ``result``: question, points, max, result, message (pandas)."""
    import pandas as pd

    rows = [
        {
            "question": test.grade_id,
            "points": _number(test.points),
            "max": _number(test.max_points),
            "result": test.status,
            "message": test.message if len(test.message) <= width else test.message[: width - 3] + "...",
        }
        for test in result.tests
    ]
    return pd.DataFrame(rows, columns=["question", "points", "max", "result", "message"])


def summary_table(results: Sequence[SubmissionResult]):
    """One row per submission (the CSV): submission, source, graded, score, max_score, one
    column of points per grade_id, issues and error (pandas)."""
    import pandas as pd

    grade_ids: list[str] = []
    for result in results:
        grade_ids += [t.grade_id for t in result.tests if t.grade_id not in grade_ids]
    rows = []
    for result in results:
        row = {
            "submission": result.submission,
            "source": result.source or "",
            "graded": result.graded,
            "score": _number(result.score),
            "max_score": _number(result.max_score),
        }
        points = {t.grade_id: _number(t.points) for t in result.tests}
        row.update({grade_id: points.get(grade_id) for grade_id in grade_ids})
        row["issues"] = " | ".join(result.issues)
        row["error"] = result.error or ""
        rows.append(row)
    columns = ["submission", "source", "graded", "score", "max_score", *grade_ids, "issues", "error"]
    table = pd.DataFrame(rows, columns=columns)
    for column in ["score", "max_score", *grade_ids]:  # whole points print as 2, not 2.0
        values = table[column].dropna()
        if all(float(value).is_integer() for value in values):
            table[column] = table[column].astype("Int64")
    return table


def write_csv(results: Sequence[SubmissionResult], path: str | os.PathLike) -> Path:
    """Write :func:`summary_table` to ``path`` (one row per submission); return the path.

    Creates the parent folder if needed; raises OSError if the file cannot be written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    summary_table(results).to_csv(path, index=False)
    return path


def _left_aligned(table, columns) -> str:
    """``table.to_string()`` with the text ``columns`` aligned left, as people read them."""
    formatters = {
        column: ("{:<%d}" % max([len(column), *(len(str(v)) for v in table[column])])).format
        for column in columns
    }
    return table.to_string(index=False, formatters=formatters, justify="left")


def _print_result(result: SubmissionResult, out) -> None:
    if not result.graded:
        print(f"== {result.submission}: NOT GRADED: {result.error}\n", file=out)
        return
    print(
        f"== {result.submission} ({result.source}): "
        f"{_number(result.score)}/{_number(result.max_score)} points, {result.seconds:.1f} s",
        file=out,
    )
    print(_left_aligned(results_table(result), ("question", "result", "message")), file=out)
    for issue in result.issues:
        print(f"  note: {issue}", file=out)
    print(file=out)


# --------------------------------------------------------------------------- command line


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="course-grade",
        description="Release the course's graded notebooks and autograde submissions.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    rel = commands.add_parser(
        "release", help="regenerate exercises/ from solutions/",
        description="Write the learner's copy of every graded notebook (solutions -> exercises).",
    )
    rel.add_argument("--source", default="solutions", help="source folder (default: solutions)")
    rel.add_argument("--dest", default="exercises", help="output folder (default: exercises)")
    rel.add_argument(
        "--check", action="store_true",
        help="write nothing; exit 1 if DEST is out of date with SOURCE",
    )
    grd = commands.add_parser(
        "grade", help="grade submissions (notebooks or folders of them)",
        description="Execute each submission with the source's tests and score it. "
        "Exit status 0: every submission was graded; 1: some could not be graded.",
    )
    grd.add_argument("paths", nargs="+", metavar="SUBMISSION_OR_FOLDER")
    grd.add_argument("--source", default="solutions", help="source folder (default: solutions)")
    grd.add_argument("--csv", metavar="FILE", help="write one row per submission to FILE")
    grd.add_argument("--json", action="store_true", help="print the results as JSON, no tables")
    grd.add_argument(
        "--cell-timeout", type=_positive_seconds, default=DEFAULT_CELL_TIMEOUT, metavar="S",
        help=f"seconds per cell (default: {DEFAULT_CELL_TIMEOUT:g})",
    )
    grd.add_argument(
        "--timeout", type=_positive_seconds, default=DEFAULT_TIMEOUT, metavar="S",
        help=f"seconds per notebook, kernel start included (default: {DEFAULT_TIMEOUT:g})",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``course-grade`` command. Returns the exit status.

    ``release``: 0 when written (or, with ``--check``, when up to date), 1 when ``--check``
    finds exercises out of date. ``grade``: 0 when every submission was graded (whatever its
    score), 1 when some could not be graded. Bad arguments or malformed sources: 2.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    out = sys.stdout
    try:
        if args.command == "release":
            if args.check:
                problems = check_release(args.source, args.dest)
                for problem in problems:
                    print(problem, file=out)
                if problems:
                    print(f"run `course-grade release --source {args.source} --dest {args.dest}`",
                          file=out)
                    return 1
                print(f"{args.dest}/ is up to date with {args.source}/", file=out)
                return 0
            written = release(args.source, args.dest)
            for path in written:
                print(f"wrote {path}", file=out)
            if not written:
                print(f"{args.dest}/ is already up to date with {args.source}/", file=out)
            for problem in check_release(args.source, args.dest):
                print(f"warning: {problem}", file=out)
            return 0

        progress = None if args.json else (lambda result: _print_result(result, out))
        results = grade(
            args.paths, args.source, cell_timeout=args.cell_timeout, timeout=args.timeout,
            progress=progress, exclude=[args.csv] if args.csv else [],
        )
        if args.csv:
            write_csv(results, args.csv)
    except (GradingError, ValueError, OSError) as error:
        print(f"course-grade: error: {error}", file=sys.stderr)
        return 2
    if args.json:
        json.dump([result.to_dict() for result in results], out, indent=1)
        print(file=out)
    else:
        summary = summary_table(results)[["submission", "graded", "score", "max_score"]]
        print(_left_aligned(summary, ("submission",)), file=out)
        if args.csv:
            print(f"wrote {args.csv}", file=out)
    return 0 if all(result.graded for result in results) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
