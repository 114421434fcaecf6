"""Reports: the table per submission, the CSV (one row per submission), the JSON-lines log.

Results are made durable as they come: :class:`Journal` appends each one to a JSON-lines file and
flushes it to disk before the next submission starts; :func:`write_csv` writes the final CSV to a
temporary file next to it and renames it over the target (``os.replace``), so a CSV is either
the old one or the complete new one, never a truncated one. All texts are already clean (see
:func:`course_grade.results.clean_text`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence, TextIO

import pandas as pd

from .files import write_atomically
from .results import SubmissionResult, display_path

MESSAGE_WIDTH = 200  # characters of a message shown in the terminal table


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else round(value, 2)


def results_table(result: SubmissionResult, width: int = MESSAGE_WIDTH):
    """One row per test cell of ``result``: question, points, max, result, message (a pandas
    DataFrame; messages cut to ``width`` characters)."""
    rows = [
        {
            "question": test.grade_id,
            "points": _number(test.points),
            "max": _number(test.max_points),
            "result": test.status,
            "message": (
                test.message if len(test.message) <= width else test.message[: width - 3] + "..."
            ),
        }
        for test in result.tests
    ]
    return pd.DataFrame(rows, columns=["question", "points", "max", "result", "message"])


def summary_table(results: Sequence[SubmissionResult]):
    """One row per submission (the CSV): submission, source, graded, score, max_score, one
    column of points per grade_id (in order of appearance), issues (joined by `` | ``) and
    error (a pandas DataFrame)."""
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
    columns = [
        "submission", "source", "graded", "score", "max_score", *grade_ids, "issues", "error",
    ]
    table = pd.DataFrame(rows, columns=columns)
    for column in ["score", "max_score", *grade_ids]:  # whole points print as 2, not 2.0
        values = table[column].dropna()
        if all(float(value).is_integer() for value in values):
            table[column] = table[column].astype("Int64")
    return table


def write_csv(results: Sequence[SubmissionResult], path: str | os.PathLike) -> Path:
    """Write :func:`summary_table` to ``path`` atomically (UTF-8); return the path.

    The table goes to a temporary file in the same folder, flushed to disk, then renamed over
    ``path``: a reader never sees a partial file, and a failure leaves any previous file intact.
    Creates the parent folder if needed; raises OSError if the file cannot be written (e.g.
    ``path`` is a folder).
    """
    if Path(path).is_dir():
        raise IsADirectoryError(f"{display_path(Path(path))} is a folder, not a file")
    table = summary_table(results)
    return write_atomically(path, lambda handle: table.to_csv(handle, index=False))


def read_log(path: str | os.PathLike) -> list[SubmissionResult]:
    """The results in a grading log (``--log``, JSON lines; see :class:`Journal`), in the
    file's order. Raises OSError if it cannot be read, ValueError (with the line number) for
    a line that is not a result."""
    results = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                results.append(SubmissionResult.from_dict(json.loads(line)))
            except ValueError as error:  # json.JSONDecodeError is a ValueError
                raise ValueError(f"{display_path(path)}, line {number}: {error}") from None
    return results


class Journal:
    """Appends each result to a JSON-lines file as soon as it is graded (one object per line,
    :meth:`SubmissionResult.to_dict`), flushed and synced to disk.

    Opening truncates the file (one file per run). Raises OSError if it cannot be opened;
    after a failed write, :attr:`error` holds the reason and later results are not written.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if self.path.is_dir():
            raise IsADirectoryError(f"{display_path(self.path)} is a folder, not a file")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle: TextIO | None = open(self.path, "w", encoding="utf-8")
        self.error: str | None = None
        self.written = 0

    def append(self, result: SubmissionResult) -> None:
        """Write ``result`` as one line and sync it to disk; never raises (see :attr:`error`)."""
        if self._handle is None:
            return
        try:
            self._handle.write(json.dumps(result.to_dict(), ensure_ascii=False) + "\n")
            self._handle.flush()
            os.fsync(self._handle.fileno())
            self.written += 1
        except (OSError, ValueError) as error:
            self.error = f"{type(error).__name__}: {error}"
            self.close()

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._handle is not None:
            try:
                self._handle.close()
            except OSError:
                pass
            self._handle = None


def _left_aligned(table, columns) -> str:
    """``table.to_string()`` with the text ``columns`` aligned left, as people read them."""
    formatters = {
        column: ("{:<%d}" % max([len(column), *(len(str(v)) for v in table[column])])).format
        for column in columns
    }
    return table.to_string(index=False, formatters=formatters, justify="left")


def print_result(result: SubmissionResult, out: TextIO) -> None:
    """Print the table of one submission (or why it was not graded), then its notes."""
    if not result.graded:
        print(f"== {result.submission}: NOT GRADED: {result.error}\n", file=out, flush=True)
        return
    print(
        f"== {result.submission} ({result.source}): "
        f"{_number(result.score)}/{_number(result.max_score)} points, {result.seconds:.1f} s",
        file=out,
    )
    print(_left_aligned(results_table(result), ("question", "result", "message")), file=out)
    for issue in result.issues:
        print(f"  note: {issue}", file=out)
    print(file=out, flush=True)


def print_progress(result: SubmissionResult, done: int, total: int, out: TextIO) -> None:
    """One line as a submission finishes (``-j N``: the tables come in the files' order)."""
    what = (f"{_number(result.score)}/{_number(result.max_score)} points" if result.graded
            else "not graded")
    try:
        print(f"[{done}/{total}] {result.submission}: {what}, {result.seconds:.1f} s",
              file=out, flush=True)
    except (OSError, ValueError):
        pass


def print_summary(results: Sequence[SubmissionResult], out: TextIO) -> None:
    """Print one line per submission: submission, graded, score, max_score."""
    if not results:
        print("no submission was graded", file=out)
        return
    summary = summary_table(results)[["submission", "graded", "score", "max_score"]]
    print(_left_aligned(summary, ("submission",)), file=out, flush=True)
