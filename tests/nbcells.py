"""The one way the tests read a notebook's cells: by id, as nbformat reads them (cell ids are what
the grader matches on, so every test finds a cell the same way).

``from nbcells import cell, code, code_cells, notebook`` in a test module (pytest puts ``tests/``
on ``sys.path``). Every function takes a notebook (an nbformat ``NotebookNode``) or a path.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
from nbformat import NotebookNode

ROOT = Path(__file__).resolve().parents[1]

#: The lessons, in order (``notebooks/NN_name.ipynb``).
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def notebook(nb: NotebookNode | str | Path) -> NotebookNode:
    """``nb`` itself, or the notebook at a path (nbformat 4)."""
    if isinstance(nb, (str, Path)):
        return nbformat.read(Path(nb), as_version=4)
    return nb


def cell(nb: NotebookNode | str | Path, cell_id: str) -> NotebookNode:
    """The one cell whose id is ``cell_id``; a test fails, naming the id, if there is not
    exactly one."""
    nb = notebook(nb)
    found = [c for c in nb.cells if c.get("id") == cell_id]
    assert len(found) == 1, f"expected one cell with id {cell_id!r}, found {len(found)}"
    return found[0]


def code_cells(nb: NotebookNode | str | Path) -> list[NotebookNode]:
    """The code cells, in order."""
    return [c for c in notebook(nb).cells if c.cell_type == "code"]


def markdown(nb: NotebookNode | str | Path) -> str:
    """All markdown cells' text, joined by newlines: the notebook's prose."""
    return "\n".join(c.source for c in notebook(nb).cells if c.cell_type == "markdown")


def python(source: str) -> str:
    """A cell's source without IPython's line and cell magics (``%matplotlib inline``,
    ``%%writefile``): what ``ast`` can parse."""
    return "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("%"))


def code(nb: NotebookNode | str | Path) -> str:
    """All code cells' Python (`python`), joined by newlines."""
    return "\n".join(python(c.source) for c in code_cells(nb))


# ------------------------------------------------------------------ what a notebook shows

MAX_COLUMNS = 6
_VERDICT_NEAR_EMULATED = re.compile(
    r"emulat[^\n]{0,80}?\d+(\.\d+)?x (faster|slower)|\d+(\.\d+)?x (faster|slower)[^\n]{0,80}?emulat")


def table_columns(html: str) -> list[int]:
    """The column count of each pandas table in ``html``: the header cells of a table's first
    header row, less the index's corner cell."""
    counts = []
    for table in re.findall(r"<table.*?</table>", html, flags=re.S):
        head = re.search(r"<thead>\s*<tr[^>]*>(.*?)</tr>", table, flags=re.S)
        if head:
            counts.append(max(0, len(re.findall(r"<th[\s>]", head.group(1))) - 1))
    return counts


#: Issue 28: in the Korean edition a printed line may keep code, units and terms (in backticks,
#: quotes or parentheses, or single words such as a policy's name) in English, but not a sentence:
#: four English words in a row, once those are set aside, are one.
_SET_ASIDE = re.compile(r"`[^`]*`|'[^'\n]*'|\"[^\"\n]*\"|\([^()\n]*\)|\[[^\[\]\n]*\]|https?://\S+")
_ENGLISH_RUN = re.compile(r"\b[A-Za-z][a-z]+(?:[ ,;:/-]+[A-Za-z][a-z]+\b){3,}")


def english_sentences(text: str) -> list[str]:
    """The runs of four or more English words in ``text`` outside code, quotes and parentheses."""
    found = []
    for line in text.splitlines():
        kept = line
        for _ in range(3):                     # nested parentheses, innermost first
            kept = _SET_ASIDE.sub(" ", kept)
        found += [m.group(0) for m in _ENGLISH_RUN.finditer(kept)]
    return found


def shown_problems(outputs, korean: bool = False) -> list[str]:
    """What breaks the rules above in a cell's outputs (nbformat-like dicts); ``korean``: the
    cell is the Korean edition's, so an English sentence it prints is one too."""
    problems = []
    for out in outputs:
        data = out.get("data", {}) if isinstance(out, dict) else {}
        html = data.get("text/html", "")
        html = "".join(html) if isinstance(html, list) else html
        for n in table_columns(html):
            if n > MAX_COLUMNS:
                problems.append(f"a table of {n} columns (at most {MAX_COLUMNS})")
        text = out.get("text", "") or data.get("text/plain", "")
        text = "".join(text) if isinstance(text, list) else text
        for m in _VERDICT_NEAR_EMULATED.finditer(text):
            problems.append(f"an emulated timing with a verdict word: {m.group(0)!r}")
        if korean and out.get("name") != "stderr":
            problems += [f"English in the Korean edition: {run!r}" for run in english_sentences(text)]
    return problems
