"""The graded-notebook source format (nbgrader's conventions) and reading notebook files.

A graded notebook has one source, ``solutions/NN_name.ipynb``:

* solution code sits between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` lines;
* a test cell carries the cell metadata
  ``nbgrader: {grade: true, grade_id: "...", points: N, locked: true, solution: false}``
  and may hold hidden tests between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS``;
* other cells with ``nbgrader: {locked: true}`` are read-only (given code the tests rely on).

Test cells and read-only cells are the *protected* cells: the grader always runs the source's copy.
Sources are the instructor's files; submissions are untrusted, and :func:`read_submission` reads
them without following symbolic links, with a size cap, and with errors that never quote the file.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .files import MiB

try:
    import nbformat
    from nbformat import NotebookNode
    from nbformat.v4.rwbase import rejoin_lines, strip_transient
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "course_grade needs nbformat and nbclient: pip install 'course_utils[grade]'"
    ) from error

BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"
BEGIN_HIDDEN_TESTS = "### BEGIN HIDDEN TESTS"
END_HIDDEN_TESTS = "### END HIDDEN TESTS"
CODE_STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
MARKDOWN_STUB = ("YOUR ANSWER HERE",)
METADATA_KEY = "course_grade"  # notebook metadata written at release: {"source": "NN_name.ipynb"}
DEFAULT_MAX_SIZE = 64 * MiB  # bytes: the largest submission file the grader reads

CELL_TYPES = ("code", "markdown", "raw")


class GradingError(ValueError):
    """A graded notebook's source is malformed, or a path does not hold what it should."""


# --------------------------------------------------------------------------- text helpers


def cell_text(source: Any) -> str:
    """A cell's ``source`` as one string (nbformat allows a list of lines)."""
    if isinstance(source, list):
        return "".join(str(part) for part in source)
    return "" if source is None else str(source)


def first_line(text: Any) -> str:
    """The first non-blank line of ``text``, stripped ('' if none)."""
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "")


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


def nbgrader(cell: Any) -> dict:
    """The cell's ``nbgrader`` metadata, or {} when it has none (or not a dict)."""
    meta = cell.get("metadata") if isinstance(cell, dict) else None
    meta = meta.get("nbgrader") if isinstance(meta, dict) else None
    return meta if isinstance(meta, dict) else {}


def is_test(cell: Any) -> bool:
    """True for a test cell (``nbgrader.grade: true``)."""
    return bool(nbgrader(cell).get("grade"))


def is_protected(cell: Any) -> bool:
    """Test cells and read-only cells: the grader always executes the source's copy."""
    meta = nbgrader(cell)
    return bool(meta.get("grade") or meta.get("locked"))


# --------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class TestCell:
    """One test cell of a source notebook: ``points`` if it runs without an error."""

    __test__ = False  # not a pytest test class

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


def parse_notebook(data: bytes) -> NotebookNode:
    """Parse the bytes of a ``.ipynb`` file into an nbformat-4 notebook.

    Only format 4 is read (cell ids, which the grader matches on, came with it; nbformat's
    converter from format 3 would log the file's content). Every cell must be a dict with a
    known ``cell_type``; a cell's
    ``source`` becomes one string and a ``metadata`` that is not a dict becomes {}. Cell ids are
    kept as stored (nbformat's reader would silently repair them). Raises ValueError with a reason
    that never quotes the file's content (the file may not be a notebook at all).
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"not UTF-8 text (byte {error.start})") from None
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        where = f" (line {error.lineno}, column {error.colno})" if hasattr(error, "lineno") else ""
        raise ValueError(f"not JSON{where}") from None
    if not isinstance(raw, dict) or "nbformat" not in raw:
        raise ValueError("not a Jupyter notebook (no nbformat field)")
    version = raw.get("nbformat")
    if version != 4:
        if isinstance(version, int) and not isinstance(version, bool) and version < 4:
            raise ValueError(
                f"notebook format {version} (before 2015): open and save it in a current Jupyter"
            )
        raise ValueError("not a Jupyter notebook of format 4")
    cells = raw.get("cells")
    if not isinstance(cells, list):
        raise ValueError("it has no list of cells")
    clean = []
    for index, cell in enumerate(cells, start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") not in CELL_TYPES:
            raise ValueError(f"cell {index} has no cell_type (code, markdown or raw)")
        if "source" not in cell:
            raise ValueError(f"cell {index} has no source")
        new = dict(cell)
        new["source"] = cell_text(cell.get("source"))
        if not isinstance(cell.get("metadata"), dict):
            new["metadata"] = {}
        if "id" in cell and not isinstance(cell["id"], str):
            new.pop("id")
        clean.append(new)
    metadata = raw.get("metadata")
    minor = raw.get("nbformat_minor")
    nb = nbformat.from_dict(
        {
            "nbformat": 4,
            "nbformat_minor": minor if type(minor) is int else 5,
            "metadata": metadata if isinstance(metadata, dict) else {},
            "cells": clean,
        }
    )
    return strip_transient(rejoin_lines(nb))  # what nbformat's own reader does


def read_submission(path: str | os.PathLike, max_bytes: int = DEFAULT_MAX_SIZE) -> NotebookNode:
    """Read an untrusted submission file as an nbformat-4 notebook (see :func:`parse_notebook`).

    The file must be a regular file and not a symbolic link (checked when it is opened, with
    ``O_NOFOLLOW``: a link to the reference solution or to a system file is never read), and at
    most ``max_bytes`` bytes long. Raises GradingError with a reason that never quotes the file.
    """
    path = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    flags |= getattr(os, "O_CLOEXEC", 0)
    if path.is_symlink():
        raise GradingError("a symbolic link, not a file: links are never followed")
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise GradingError("no such file") from None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise GradingError("a symbolic link, not a file: links are never followed") from None
        raise GradingError(f"cannot be opened: {error.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise GradingError("not a regular file")
        if info.st_size > max_bytes:
            size, limit = info.st_size / MiB, max_bytes / MiB
            raise GradingError(f"too large: {size:.1f} MiB (the limit is {limit:g} MiB)")
        try:
            data = handle.read(max_bytes + 1)
        except OSError as error:
            raise GradingError(f"cannot be read: {error.strerror}") from None
    if len(data) > max_bytes:
        raise GradingError(f"too large (the limit is {max_bytes / MiB:g} MiB)")
    try:
        return parse_notebook(data)
    except ValueError as error:
        raise GradingError(f"not a readable notebook: {error}") from None


def load_source(path: str | os.PathLike) -> SourceNotebook:
    """Read and check one source notebook (``solutions/NN_name.ipynb``).

    Checks that every cell has a unique id, that solution and hidden-test markers are balanced,
    that every test cell is a code cell with a ``grade_id`` (unique in the notebook), ``points``
    (a number >= 0) and no solution region, and that there is at least one test cell.
    Raises GradingError with the notebook, the cell and the problem otherwise.
    """
    path = Path(path)
    try:
        nb = parse_notebook(path.read_bytes())
    except FileNotFoundError:
        raise GradingError(f"{path}: no such file") from None
    except (OSError, ValueError) as error:
        raise GradingError(f"{path}: not a readable notebook ({error})") from None
    ids: set[str] = set()
    tests: list[TestCell] = []
    grade_ids: set[str] = set()
    for index, cell in enumerate(nb.cells, start=1):
        cell_id = cell.get("id")
        where = f"{path}, cell {index} (id {cell_id!r})"
        if not cell_id:
            raise GradingError(
                f"{path}, cell {index}: no cell id; the grader matches cells by id "
                "(save the notebook with nbformat >= 4.5, e.g. any current Jupyter)"
            )
        if cell_id in ids:
            raise GradingError(f"{where}: the cell id is used twice")
        ids.add(cell_id)
        text = cell.source
        clear_solutions(text, markdown=cell.cell_type == "markdown", where=where)
        remove_hidden_tests(text, where=where)
        meta = nbgrader(cell)
        if is_protected(cell) and (meta.get("solution") or BEGIN_SOLUTION in text):
            raise GradingError(
                f"{where}: a test or read-only cell (nbgrader.grade or nbgrader.locked) cannot "
                "hold a solution: the grader replaces it by the source's copy"
            )
        if not is_test(cell):
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


def notebooks_in(folder: Path) -> list[Path]:
    """The ``*.ipynb`` files directly in ``folder``, sorted by name."""
    return sorted(p for p in Path(folder).glob("*.ipynb") if p.is_file())


def load_sources(source_dir: str | os.PathLike = "solutions") -> dict[str, SourceNotebook]:
    """Load and check every ``*.ipynb`` in ``source_dir``, keyed by file name.

    Raises GradingError if the folder does not exist or holds no notebook, if a notebook is
    malformed (see :func:`load_source`), or if a grade_id is used by two notebooks (the CSV has
    one column per grade_id).
    """
    folder = Path(source_dir)
    if not folder.is_dir():
        raise GradingError(f"source folder {folder} " + ("is a file, not a folder"
                                                          if folder.exists() else "does not exist"))
    paths = notebooks_in(folder)
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
