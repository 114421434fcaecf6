"""Which source a submission belongs to, and the notebook the grader executes for it.

The executed notebook follows the source's cell order: the source's own copy of every protected
cell (matched by cell id, hidden tests included: a learner cannot edit or delete a test away), the
learner's version of every other cell, the learner's own extra cells after the cell they followed,
and the released version of any cell the learner deleted.
"""

from __future__ import annotations

import copy
import difflib
import math
from pathlib import Path

from nbformat import NotebookNode

from .notebook import (
    METADATA_KEY,
    GradingError,
    SourceNotebook,
    first_line,
    is_protected,
    nbgrader,
)
from .release import release_notebook

MIN_PROTECTED_SHARE = 0.5  # of the source's cells a submission must carry (by cell id)


def describe(cell: NotebookNode) -> str:
    """A short name for a cell in notes: ``test 'grade_id'``, ``code cell 'id' ("first line")``."""
    meta = nbgrader(cell)
    if meta.get("grade"):
        return f"test {meta.get('grade_id')!r}"
    first = first_line(cell.source)
    first = first[:40] + ("..." if len(first) > 40 else "")
    return f"{cell.cell_type} cell {cell.get('id')!r}" + (f' ("{first}")' if first else "")


def match_source(
    path: Path, nb: NotebookNode, sources: dict[str, SourceNotebook]
) -> SourceNotebook:
    """The source a submission claims to be: its ``course_grade.source`` metadata, else the same
    file name, else the one source whose stem (``01_loss_scaling``) is in the file name.

    Raises GradingError if none of these names exactly one source. The claim is then checked by
    :func:`check_same_exercise`.
    """
    meta = nb.metadata.get(METADATA_KEY)
    named = meta.get("source") if isinstance(meta, dict) else None
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


def _source_key(source: SourceNotebook, cell: NotebookNode) -> str | None:
    """The id of the source cell that ``cell`` of a submission stands for: its own id, or for
    notebooks saved without ids (nbformat < 4.5), the cell whose nbgrader grade_id it has."""
    ids = {src.id for src in source.nb.cells}
    if cell.get("id") in ids:
        return cell.get("id")
    grade_id = nbgrader(cell).get("grade_id")
    if not isinstance(grade_id, str):
        return None
    same = (src.id for src in source.nb.cells if nbgrader(src).get("grade_id") == grade_id)
    return next(same, None)


def _protected_matches(source: SourceNotebook, submission: NotebookNode) -> tuple[int, int]:
    """(protected cells of ``source`` found in ``submission`` by id and text, protected cells)."""
    mine = {}
    for cell in submission.cells:
        mine.setdefault(_source_key(source, cell), cell.source.strip())
    protected = [
        (src, rel)
        for src, rel in zip(source.nb.cells, release_notebook(source.nb, source.name).cells, strict=True)
        if is_protected(src)
    ]
    found = sum(
        1
        for src, rel in protected
        if src.id in mine and mine[src.id] in (rel.source.strip(), src.source.strip())
    )
    return found, len(protected)


def _cells_by_id(source: SourceNotebook, submission: NotebookNode) -> tuple[int, int]:
    """(cells of ``source`` whose id is in ``submission``, whatever their text; cells)."""
    keys = {_source_key(source, cell) for cell in submission.cells}
    return sum(1 for src in source.nb.cells if src.id in keys), len(source.nb.cells)


def check_same_exercise(
    source: SourceNotebook, submission: NotebookNode, sources: dict[str, SourceNotebook]
) -> None:
    """Check that ``submission`` is an exercise of ``source``, not another one renamed.

    A submission is refused as "a different exercise" only when another source matches it
    better: a larger share of that source's test and read-only cells is in the submission under
    its cell id and with its released (or source) text (a notebook made from ``exercises/``
    has them all; ties go to ``source``). Otherwise it is graded if it holds at least half
    (:data:`MIN_PROTECTED_SHARE`) of ``source``'s cells by cell id, whatever their text: tests
    the learner changed are graded from the source's copy, and :func:`assemble` notes which.
    Raises GradingError ("looks like a different exercise", naming the source it resembles
    most; or "does not look like", with the count of cells found) otherwise.
    """
    found, total = _protected_matches(source, submission)
    share = found / total if total else 0.0
    better = []
    for name, other in sources.items():
        other_found, other_total = _protected_matches(other, submission)
        if name != source.name and other_total and other_found / other_total > share:
            better.append((other_found / other_total, name))
    if better:
        raise GradingError(
            f"looks like a different exercise: it has {found} of the {total} test and read-only "
            f"cells of {source.name} (matched by cell id and text); it looks like "
            f"{max(better)[1]}"
        )
    present, cells = _cells_by_id(source, submission)
    if present < max(1, math.ceil(MIN_PROTECTED_SHARE * cells)):
        raise GradingError(
            f"does not look like {source.name}: it has {present} of its {cells} cells "
            f"(matched by cell id); was it made from exercises/{source.name}?"
        )


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


def assemble(
    source: SourceNotebook, submission: NotebookNode
) -> tuple[NotebookNode, dict[str, int], list[str]]:
    """Build the notebook to execute for ``submission``.

    Returns the notebook (outputs cleared), the index in it of each source cell (by cell id),
    and notes on deleted, moved and edited cells. Raises GradingError if no cell of the
    submission matches a cell of the source.
    """
    src_cells = source.nb.cells
    released = release_notebook(source.nb, source.name).cells
    position = {cell.id: i for i, cell in enumerate(src_cells)}
    learner: dict[str, NotebookNode] = {}
    extra: dict[str | None, list[NotebookNode]] = {}
    order: list[str] = []
    current: str | None = None
    for cell in submission.cells:
        key = _source_key(source, cell)
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

    cells = [_without_outputs(own) for own in extra.get(None, [])]
    index_of: dict[str, int] = {}
    restored, replaced = [], []
    for src, rel in zip(src_cells, released, strict=True):
        mine = learner.get(src.id)
        if mine is None:
            restored.append(describe(rel))
        if is_protected(src):
            cell = _without_outputs(src)
            if mine is not None and mine.cell_type != rel.cell_type:
                replaced.append(f"{describe(rel)} (made a {mine.cell_type} cell)")
            elif mine is not None and mine.source not in (rel.source, src.source):
                replaced.append(f"{describe(rel)} ({_change(rel.source, mine.source)})")
        elif mine is not None:
            cell = _without_outputs(mine)
        else:
            cell = _without_outputs(rel)
        index_of[src.id] = len(cells)
        cells.append(cell)
        cells.extend(_without_outputs(own) for own in extra.get(src.id, []))

    issues = []
    if restored:
        issues.append(f"deleted cells put back from the source: {', '.join(restored)}")
    moved_keep = _longest_increasing([position[key] for key in order])
    moved = [key for i, key in enumerate(order) if i not in moved_keep]
    if moved:
        issues.append(
            "cells moved out of the original order (graded in the original order): "
            + ", ".join(describe(src_cells[position[key]]) for key in moved)
        )
    if replaced:
        protected = sum(1 for src in src_cells if is_protected(src))
        issues.append(
            f"{len(replaced)} of the {protected} test and read-only cells differ from the "
            "source (edited, or from an older release); they were graded with the source's "
            f"tests restored: {', '.join(replaced)}"
        )

    nb = NotebookNode(
        nbformat=4, nbformat_minor=submission.get("nbformat_minor", 5),
        metadata=copy.deepcopy(submission.metadata), cells=cells,
    )
    return nb, index_of, issues


def _change(released: str, mine: str) -> str:
    """How the learner's text of a protected cell differs from the released one, in a few
    words: lines removed, added, or edited (counts of lines, never their text)."""
    old, new = released.splitlines(), mine.splitlines()
    removed = added = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new).get_opcodes():
        if tag in ("replace", "delete"):
            removed += i2 - i1
        if tag in ("replace", "insert"):
            added += j2 - j1
    if not new or not "".join(new).strip():
        return "emptied"
    parts = []
    if removed:
        parts.append(f"{removed} line{'s' * (removed != 1)} removed or edited")
    if added:
        parts.append(f"{added} line{'s' * (added != 1)} added or edited")
    return "edited: " + ", ".join(parts) if parts else "edited: whitespace"


def _without_outputs(cell: NotebookNode) -> NotebookNode:
    """A copy of ``cell`` with no outputs and no execution count (they are never trusted)."""
    fresh = NotebookNode({key: value for key, value in cell.items() if key != "outputs"})
    fresh = copy.deepcopy(fresh)
    if fresh.get("cell_type") == "code":
        fresh.outputs = []
        fresh.execution_count = None
    return fresh
