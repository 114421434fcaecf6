"""Feedback files: one page per submission that the learner can open (HTML or Markdown).

A page gives the score, then for each question its text (from the released notebook), each
test's points, result and message, and the grader's notes (deleted cells put back, tests
restored, a cell that stopped the kernel). It is written from the released notebook and the
results only: never a solution, never a hidden test's code. A failure message that quotes a
line of a hidden test (``AssertionError at line 12: assert ...``, for a bare ``assert``) is
cut to ``AssertionError in a hidden check``; messages the instructor wrote in a hidden
check's ``assert ..., "message"`` are shown, as they are meant to be.
"""

from __future__ import annotations

import html
import os
import re
from pathlib import Path
from typing import Iterable, Sequence

from .notebook import BEGIN_HIDDEN_TESTS, END_HIDDEN_TESTS, SourceNotebook, first_line, nbgrader
from .release import release_notebook
from .results import SubmissionResult

FORMATS = ("html", "md")
_QUESTION_HEADING = re.compile(r"^#{1,6}\s+.*question", re.I)
_AT_LINE = re.compile(r"^([A-Za-z_][\w.]*) at line (\d+): ")


def _hidden_lines(text: str) -> set[int]:
    """1-based numbers of the lines of ``text`` inside hidden-test regions (markers included)."""
    hidden, inside = set(), False
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith(BEGIN_HIDDEN_TESTS):
            inside = True
        if inside:
            hidden.add(number)
        if stripped.startswith(END_HIDDEN_TESTS):
            inside = False
    return hidden


def safe_message(message: str, test_source: str) -> str:
    """``message`` as a learner may read it: ``Name at line N: code`` becomes ``Name in a hidden
    check`` when line N of ``test_source`` (the test cell as executed) is a hidden test's."""
    match = _AT_LINE.match(message)
    if match and int(match.group(2)) in _hidden_lines(test_source):
        return f"{match.group(1)} in a hidden check"
    return message


def question_texts(source: SourceNotebook) -> dict[str, str]:
    """grade_id -> the text of the question its test checks: the last markdown cell before the
    test cell with a heading that names a question (from that heading on), else the last
    markdown cell with any heading; from the released notebook, never a solution cell."""
    texts: dict[str, str] = {}
    question = heading = ""
    for cell in release_notebook(source.nb, source.name).cells:
        meta = nbgrader(cell)
        if cell.cell_type == "markdown" and not meta.get("solution"):
            lines = cell.source.splitlines()
            starts = [i for i, line in enumerate(lines) if _QUESTION_HEADING.match(line)]
            if starts:
                question = "\n".join(lines[starts[0]:]).strip()
            elif any(line.startswith("#") for line in lines):
                heading = cell.source.strip()
                question = ""
        elif meta.get("grade"):
            texts[str(meta.get("grade_id"))] = question or heading
    return texts


def _test_titles(source: SourceNotebook) -> dict[str, str]:
    """grade_id -> the test cell's first line in the released notebook (``# Test: ...``)."""
    return {
        str(nbgrader(cell).get("grade_id")): first_line(cell.source).lstrip("# ").strip()
        for cell in release_notebook(source.nb, source.name).cells if nbgrader(cell).get("grade")
    }


def _number(value: float) -> str:
    return f"{value:g}"


def _sections(result: SubmissionResult, source: SourceNotebook | None):
    """The page's content, format-free: title, summary lines, notes, per-question blocks."""
    title = f"Feedback: {result.source or Path(result.submission).name}"
    if not result.graded:
        return title, [f"Submission: {result.submission}", f"Not graded: {result.error}"], [], []
    summary = [
        f"Submission: {result.submission}",
        f"Score: {_number(result.score)} / {_number(result.max_score)} points",
    ]
    texts = question_texts(source) if source is not None else {}
    titles = _test_titles(source) if source is not None else {}
    cells = {str(nbgrader(c).get("grade_id")): c.source for c in source.nb.cells
             if nbgrader(c).get("grade")} if source is not None else {}
    blocks = []
    for test in result.tests:
        message = safe_message(test.message, cells.get(test.grade_id, ""))
        blocks.append({
            "grade_id": test.grade_id,
            "question": texts.get(test.grade_id, ""),
            "test": titles.get(test.grade_id, ""),
            "points": f"{_number(test.points)} / {_number(test.max_points)}",
            "result": test.status,
            "message": message,
        })
    return title, summary, list(result.issues), blocks


def feedback_markdown(result: SubmissionResult, source: SourceNotebook | None) -> str:
    """The feedback page of ``result`` as Markdown (``source``: its source notebook, for the
    question texts; None if it matched none)."""
    title, summary, notes, blocks = _sections(result, source)
    out = [f"# {title}", ""] + [f"- {line}" for line in summary] + [""]
    if blocks:
        out += ["| question | points | result |", "|---|---|---|"]
        out += [f"| {b['grade_id']} | {b['points']} | {b['result']} |" for b in blocks]
        out.append("")
    if notes:
        out += ["## Notes from the grader", ""] + [f"- {note}" for note in notes] + [""]
    for b in blocks:
        out += [f"## {b['grade_id']}: {b['points']} points, {b['result']}", ""]
        if b["test"]:
            out += [f"Test: {b['test']}", ""]
        if b["message"]:
            out += ["Message:", "", "```text", b["message"], "```", ""]
        if b["question"]:
            out += ["The question:", ""] + [f"> {line}" for line in b["question"].splitlines()]
            out.append("")
    return "\n".join(out)


_STYLE = (
    "body{font-family:sans-serif;max-width:50em;margin:2em auto;line-height:1.4}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .6em}"
    ".fail,.not-run{color:#a00}.pass{color:#070}"
    ".question{white-space:pre-wrap;background:#f6f6f6;padding:.6em;border-left:3px solid #999}"
    "pre{white-space:pre-wrap;background:#fff4f4;padding:.4em}"
)


def feedback_html(result: SubmissionResult, source: SourceNotebook | None) -> str:
    """The feedback page of ``result`` as one self-contained HTML file (no script, no link);
    every text is escaped. The question text is shown as written (Markdown source)."""
    title, summary, notes, blocks = _sections(result, source)
    e = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{e(title)}</title><style>{_STYLE}</style></head><body>", f"<h1>{e(title)}</h1>"]
    out += ["<ul>"] + [f"<li>{e(line)}</li>" for line in summary] + ["</ul>"]
    if blocks:
        out.append("<table><tr><th>question</th><th>points</th><th>result</th></tr>")
        out += [f"<tr><td>{e(b['grade_id'])}</td><td>{e(b['points'])}</td>"
                f"<td class=\"{e(b['result'].replace(' ', '-'))}\">{e(b['result'])}</td></tr>"
                for b in blocks]
        out.append("</table>")
    if notes:
        out += ["<h2>Notes from the grader</h2>", "<ul>"]
        out += [f"<li>{e(note)}</li>" for note in notes] + ["</ul>"]
    for b in blocks:
        out.append(f"<h2>{e(b['grade_id'])}: {e(b['points'])} points, "
                   f"<span class=\"{e(b['result'].replace(' ', '-'))}\">{e(b['result'])}</span></h2>")
        if b["test"]:
            out.append(f"<p>Test: {e(b['test'])}</p>")
        if b["message"]:
            out.append(f"<p>Message:</p><pre>{e(b['message'])}</pre>")
        if b["question"]:
            out.append(f"<p>The question:</p><div class=\"question\">{e(b['question'])}</div>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def feedback_names(submissions: Sequence[str], suffix: str) -> list[Path]:
    """A relative file name for each submission's page: its path below the folder all the
    submissions share, with ``suffix`` for ``.ipynb`` (``alice/01_loss_scaling.html``)."""
    parts = [Path(s).parts for s in submissions]
    common = 0
    if len(parts) > 1:
        while all(len(p) > common + 1 and p[common] == parts[0][common] for p in parts):
            common += 1
    elif parts:
        common = len(parts[0]) - 1
    names = []
    for p in parts:
        rel = [part for part in p[common:] if part not in ("", ".", "..", os.sep)]
        rel = rel or ["submission"]
        name = Path(*rel)
        names.append(name.with_name(name.stem + suffix) if name.suffix == ".ipynb"
                     else name.with_name(name.name + suffix))
    return names


def write_feedback(
    results: Iterable[SubmissionResult],
    sources: dict[str, SourceNotebook],
    folder: str | os.PathLike,
    fmt: str = "html",
) -> list[Path]:
    """Write one feedback page per result into ``folder`` (``fmt`` "html" or "md"), named as
    :func:`feedback_names` says; return the paths written. Raises ValueError for an unknown
    format, OSError if a file cannot be written."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown feedback format {fmt!r}: use one of {', '.join(FORMATS)}")
    results = list(results)
    folder = Path(folder)
    render = feedback_html if fmt == "html" else feedback_markdown
    written = []
    names = feedback_names([r.submission for r in results], "." + fmt)
    seen: set[Path] = set()
    for result, name in zip(results, names, strict=True):
        target = folder / name
        counter = 1
        while target in seen:  # two submissions with one name: never overwrite a page
            counter += 1
            target = target.with_name(f"{name.stem}-{counter}{name.suffix}")
        seen.add(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render(result, sources.get(result.source or "")), encoding="utf-8")
        written.append(target)
    return written
