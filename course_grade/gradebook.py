"""The gradebook: grading results per learner, from a roster, and exports an LMS imports.

**Roster** (a CSV file with a header row): one row per learner, or several rows for one learner.

* ``learner`` (required): the learner's id, as the gradebook and the LMS export show it;
* ``submission`` (required): the names of the learner's folders or files in the class folder,
  separated by ``;`` (``alice``, ``bob_01_loss_scaling.ipynb``). A name matches a submission
  when it is one of the folders or the file name of its path, or when one of those starts with
  the name and ``_`` (the LMS download layouts: Canvas ``smithjohn_12345_..._01_x.ipynb``,
  Moodle ``John Smith_12345_assignsubmission_file_/``);
* optional: ``name``, ``email``, ``section``, ``canvas_id`` (Canvas's numeric user ID, from its
  gradebook export), ``login`` (Canvas's SIS Login ID).

A submission that no roster name matches, or that two learners' names match, is listed as
unmatched and counts for nobody; a learner without a graded submission of an exercise is listed
as missing it.

**Summary**: one row per learner (roster order), one column per exercise (the score, blank when
missing or not graded), the total, the maximum, and notes (several submissions of one exercise:
the highest score counts; submissions not graded and why).

**LMS exports**, both one row per learner and one column per exercise, blank when missing (both
LMSs leave a blank grade unchanged):

* Moodle, *Grades > Import > CSV file*: ``ID number``, ``Email address``, ``Full name``, then one
  column per exercise (the exercise's file stem, e.g. ``01_loss_scaling``). At import, map
  ``ID number`` (or ``Email address``) to the user field and each exercise column to its grade
  item.
* Canvas, *Grades > Import*: ``Student``, ``ID``, ``SIS User ID``, ``SIS Login ID``,
  ``Section``, then one column per exercise, and a ``Points Possible`` row under the header.
  Canvas finds each learner by ``ID`` (the roster's ``canvas_id``), ``SIS User ID`` (the
  roster's ``learner``) or ``SIS Login ID`` (``login``); a column whose title is not an
  assignment of the course creates one (rename the column to ``Name (assignment id)`` as in
  Canvas's own export to fill an existing one).
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd

from .files import write_atomically
from .results import SubmissionResult

ROSTER_REQUIRED = ("learner", "submission")
ROSTER_OPTIONAL = ("name", "email", "section", "canvas_id", "login")


@dataclass
class Learner:
    """One learner of the roster: ``learner`` id, the folder or file ``names`` that are theirs,
    and the optional columns (empty strings when absent)."""

    learner: str
    names: list[str] = field(default_factory=list)
    name: str = ""
    email: str = ""
    section: str = ""
    canvas_id: str = ""
    login: str = ""


def read_roster(path: str | os.PathLike) -> list[Learner]:
    """Read a roster CSV (see the module's docstring); learners in the file's order.

    Raises ValueError (naming the file and line) for a missing column, an empty learner id or
    submission name, or a name given to two learners; OSError if it cannot be read.
    """
    with open(path, newline="", encoding="utf-8-sig") as handle:  # Excel's BOM
        reader = csv.DictReader(handle)
        header = [h.strip() for h in reader.fieldnames or []]
        missing = [c for c in ROSTER_REQUIRED if c not in header]
        if missing:
            raise ValueError(f"{path}: the roster needs the columns {', '.join(ROSTER_REQUIRED)}; "
                             f"missing: {', '.join(missing)} (found: {', '.join(header) or 'none'})")
        learners: dict[str, Learner] = {}
        owner: dict[str, str] = {}
        for number, raw in enumerate(reader, start=2):
            row = {(k or "").strip(): (v or "").strip() for k, v in raw.items()}
            lid = row.get("learner", "")
            names = [n.strip() for n in row.get("submission", "").split(";") if n.strip()]
            if not lid:
                raise ValueError(f"{path}, line {number}: no learner id")
            if not names:
                raise ValueError(f"{path}, line {number}: learner {lid!r} has no submission name")
            learner = learners.setdefault(lid, Learner(lid))
            for key in ROSTER_OPTIONAL:
                if row.get(key) and not getattr(learner, key):
                    setattr(learner, key, row[key])
            for name in names:
                if owner.setdefault(name, lid) != lid:
                    raise ValueError(f"{path}, line {number}: the name {name!r} is given to both "
                                     f"{owner[name]!r} and {lid!r}")
                if name not in learner.names:
                    learner.names.append(name)
    return list(learners.values())


def _matches(name: str, submission: str) -> bool:
    parts = [p for p in Path(submission).parts if p not in ("/", "")]
    return any(p == name or p.startswith(name + "_") for p in parts)


@dataclass
class Gradebook:
    """Results per learner: ``results[learner id][exercise]`` lists that learner's results of
    an exercise; ``unmatched`` lists (submission, why) of results that count for nobody;
    ``exercises`` the exercise names (file names of the sources), in order."""

    learners: list[Learner]
    exercises: list[str]
    results: dict[str, dict[str, list[SubmissionResult]]]
    ungraded: dict[str, list[SubmissionResult]]
    unmatched: list[tuple[str, str]]
    max_points: dict[str, float]

    def missing(self) -> list[tuple[str, list[str]]]:
        """(learner id, the exercises they have no graded submission of), for those missing
        at least one, in roster order."""
        out = []
        for learner in self.learners:
            graded = self.results[learner.learner]
            absent = [e for e in self.exercises if not any(r.graded for r in graded.get(e, []))]
            if absent:
                out.append((learner.learner, absent))
        return out

    def score(self, learner: str, exercise: str) -> float | None:
        """The learner's score of an exercise (the best of their graded submissions), or None."""
        graded = [r.score for r in self.results[learner].get(exercise, []) if r.graded]
        return max(graded) if graded else None


def build_gradebook(
    results: Iterable[SubmissionResult], roster: Sequence[Learner],
    exercises: Sequence[str] | None = None, max_points: dict[str, float] | None = None,
) -> Gradebook:
    """Match ``results`` to the ``roster``'s learners (see the module's docstring).

    ``exercises``: the exercise names in column order (default: those in the results, sorted);
    ``max_points``: exercise -> points available (default: from the graded results).
    """
    results = list(results)
    names = sorted({r.source for r in results if r.source})
    exercises = list(exercises) if exercises is not None else names
    points = dict(max_points or {})
    for r in results:
        if r.graded and r.source and r.source not in points:
            points[r.source] = r.max_score
    book = Gradebook(list(roster), exercises, {lr.learner: {} for lr in roster},
                     {lr.learner: [] for lr in roster}, [], points)
    for result in results:
        owners = [lr for lr in roster if any(_matches(n, result.submission) for n in lr.names)]
        if not owners:
            book.unmatched.append((result.submission, "no roster name matches it"))
            continue
        if len(owners) > 1:
            who = ", ".join(lr.learner for lr in owners)
            book.unmatched.append((result.submission, f"the names of several learners match it: {who}"))
            continue
        lid = owners[0].learner
        if not result.graded or not result.source:
            book.ungraded[lid].append(result)
            continue
        if result.source not in book.exercises:
            book.exercises.append(result.source)
        book.results[lid].setdefault(result.source, []).append(result)
    return book


def _stem(exercise: str) -> str:
    return Path(exercise).stem


def summary_by_learner(book: Gradebook):
    """One row per learner: ``learner``, ``name``, one score column per exercise (its file stem;
    missing or not graded: empty), ``total``, ``max_total`` and ``notes`` (a pandas DataFrame)."""
    rows = []
    for learner in book.learners:
        row = {"learner": learner.learner, "name": learner.name}
        notes = []
        total = 0.0
        for exercise in book.exercises:
            score = book.score(learner.learner, exercise)
            row[_stem(exercise)] = score
            total += score or 0.0
            graded = [r for r in book.results[learner.learner].get(exercise, []) if r.graded]
            if len(graded) > 1:
                notes.append(f"{len(graded)} submissions of {_stem(exercise)}: the highest score "
                             f"counts ({', '.join(r.submission for r in graded)})")
        for result in book.ungraded[learner.learner]:
            notes.append(f"not graded: {result.submission}: {result.error}")
        row["total"] = total
        row["max_total"] = sum(book.max_points.get(e, 0.0) for e in book.exercises)
        row["notes"] = " | ".join(notes)
        rows.append(row)
    columns = ["learner", "name", *(_stem(e) for e in book.exercises), "total", "max_total",
               "notes"]
    return pd.DataFrame(rows, columns=columns)


def _number(value: float | None) -> str:
    """A score as a CSV cell: ``3``, ``2.5``; empty for None or NaN (missing)."""
    if value is None or value != value:  # NaN != NaN: pandas' missing value
        return ""
    return f"{value:g}"


def _write_rows(path: str | os.PathLike, rows: list[list[str]]) -> Path:
    """Write ``rows`` as CSV (UTF-8) atomically: a temporary file renamed over ``path``."""
    return write_atomically(path, lambda handle: csv.writer(handle, lineterminator="\n")
                            .writerows(rows))


def write_summary(book: Gradebook, path: str | os.PathLike) -> Path:
    """:func:`summary_by_learner` as a CSV file (atomically); returns the path."""
    table = summary_by_learner(book)
    rows = [list(table.columns)]
    for record in table.itertuples(index=False):
        rows.append([_number(v) if isinstance(v, float) or v is None else str(v) for v in record])
    return _write_rows(path, rows)


def write_moodle(book: Gradebook, path: str | os.PathLike) -> Path:
    """The Moodle grade import CSV (see the module's docstring); returns the path."""
    rows = [["ID number", "Email address", "Full name", *(_stem(e) for e in book.exercises)]]
    for learner in book.learners:
        rows.append([learner.learner, learner.email, learner.name,
                     *(_number(book.score(learner.learner, e)) for e in book.exercises)])
    return _write_rows(path, rows)


def write_canvas(book: Gradebook, path: str | os.PathLike) -> Path:
    """The Canvas gradebook import CSV (see the module's docstring); returns the path."""
    header = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
    rows = [header + [_stem(e) for e in book.exercises],
            ["Points Possible", "", "", "", "",
             *(_number(book.max_points.get(e)) for e in book.exercises)]]
    for learner in book.learners:
        rows.append([learner.name or learner.learner, learner.canvas_id, learner.learner,
                     learner.login, learner.section,
                     *(_number(book.score(learner.learner, e)) for e in book.exercises)])
    return _write_rows(path, rows)
