"""Release: the learner's copy of each graded notebook, and the student bundle.

``release`` writes ``exercises/NN_name.ipynb`` from ``solutions/NN_name.ipynb``: every solution
region becomes ``# YOUR CODE HERE`` + ``raise NotImplementedError()`` at the region's indentation,
hidden tests are removed, outputs and execution counts are cleared, cell ids are kept, read-only
cells are marked non-editable and non-deletable, and the notebook metadata records its source
(``course_grade.source``). ``release_student`` writes what learners get for a graded workshop.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from .notebook import (
    METADATA_KEY,
    GradingError,
    clear_solutions,
    is_protected,
    is_test,
    load_sources,
    notebooks_in,
    remove_hidden_tests,
)

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI (the grade extra has it)
    import tomli as tomllib

# Metadata that nbstripout removes by default: released notebooks must be nbstripout-clean.
_NB_METADATA_TO_DROP = ("signature", "widgets")
_CELL_METADATA_TO_DROP = (
    "collapsed", "ExecuteTime", "execution", "heading_collapsed", "hidden", "scrolled",
)

STUDENT_PACKAGE = "course_utils"  # the package learners import (never the grader)
_STUDENT_FILES = ("README.md", "README.ko.md", "LICENSE", "LICENSE.md", "LICENSE.txt",
                  "environment.yml")
#: The pages of docs/ the lessons link (the method page and the glossary, in both editions).
_STUDENT_DOCS = ("method.md", "method.ko.md", "glossary.md")
_SKIP_NAMES = ("__pycache__", ".ipynb_checkpoints")


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
        text = clear_solutions(cell.source, markdown=cell.cell_type == "markdown", where=where)
        if is_test(cell):
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
        if is_protected(cell):
            cell.metadata["editable"] = False
            cell.metadata["deletable"] = False
    return out


def dumps(nb: NotebookNode) -> str:
    """nbformat.write's layout (indent 1, sorted keys, trailing newline), as nbstripout writes."""
    return nbformat.writes(nb, version=4) + "\n"


def _planned_release(source_dir: str | os.PathLike, dest_dir: str | os.PathLike):
    sources = load_sources(source_dir)
    dest = Path(dest_dir)
    planned = {dest / name: dumps(release_notebook(src.nb, name)) for name, src in sources.items()}
    orphans = [p for p in (notebooks_in(dest) if dest.is_dir() else []) if p not in planned]
    return planned, orphans


def check_release(
    source_dir: str | os.PathLike = "solutions", dest_dir: str | os.PathLike = "exercises"
) -> list[str]:
    """Say how ``dest_dir`` differs from a fresh release of ``source_dir``; [] if up to date.

    Each entry is one problem: a missing or stale exercise, or an exercise without a source.
    Raises GradingError if the sources are malformed (see :func:`course_grade.load_sources`).
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
    :func:`check_release`. Raises GradingError if the sources are malformed, OSError if a file
    cannot be written.
    """
    planned, _ = _planned_release(source_dir, dest_dir)
    Path(dest_dir).mkdir(parents=True, exist_ok=True)
    written = []
    for path, text in planned.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written


# --------------------------------------------------------------------------- student bundle


def student_pyproject(text: str) -> str:
    """The learners' ``pyproject.toml``, derived from the course's own.

    The course's file also packages the grader (``course_grade``, its ``course-grade`` script,
    the ``grade`` and ``test`` extras and pytest's settings), none of which a learner gets. This
    keeps only ``course_utils`` (and its subpackages) in ``[tool.setuptools.packages.find]``'s
    ``include``, drops the ``course-grade`` script, the ``grade`` and
    ``test`` extras and ``[tool.pytest.ini_options]``, and leaves every other line as written.
    Raises GradingError if the result is not what it should be (the file's layout changed).
    """
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    table = ""
    skipping_array = False

    def drop_comment_above() -> None:  # the comment block that introduces a dropped entry
        while out and out[-1].lstrip().startswith("#"):
            out.pop()

    for line in lines:
        stripped = line.strip()
        if skipping_array:
            skipping_array = not stripped.startswith("]")
            continue
        header = re.match(r"^\[([^\[\]]+)\]\s*(#.*)?$", stripped)
        if header:
            table = header.group(1).strip()
        if table == "tool.pytest.ini_options":
            if header:
                drop_comment_above()
            continue
        key = re.match(r"^([A-Za-z0-9_.\"'-]+)\s*=", stripped)
        name = key.group(1).strip("\"'") if key else None
        if table == "tool.setuptools.packages.find" and name == "include":
            out.append(f'include = ["{STUDENT_PACKAGE}*"]\n')
            skipping_array = "[" in stripped and "]" not in stripped
            continue
        if table == "project.scripts" and name == "course-grade":
            drop_comment_above()
            continue
        if table == "project.optional-dependencies" and name in ("grade", "test"):
            drop_comment_above()
            skipping_array = "[" in stripped and "]" not in stripped
            continue
        out.append(line)
    result = "".join(out)
    try:
        data = tomllib.loads(result)
    except tomllib.TOMLDecodeError as error:
        raise GradingError(f"pyproject.toml: the learners' copy does not parse ({error})") from None
    packages = (data.get("tool", {}).get("setuptools", {}).get("packages", {})
                .get("find", {}).get("include"))
    scripts = data.get("project", {}).get("scripts", {})
    extras = data.get("project", {}).get("optional-dependencies", {})
    grader_left = "course-grade" in scripts or {"grade", "test"} & set(extras)
    if packages != [f"{STUDENT_PACKAGE}*"] or grader_left:
        raise GradingError(
            "pyproject.toml: cannot derive the learners' copy (expected "
            "[tool.setuptools.packages.find] include, a course-grade script and grade/test "
            "extras, one item per line)"
        )
    return result


def _copy_tree(src: Path, dest: Path, written: list[Path]) -> None:
    """Copy ``src`` to ``dest`` without hidden files, caches or compiled files (no links)."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in sorted(src.iterdir()):
        if item.name.startswith(".") or item.name in _SKIP_NAMES or item.suffix == ".pyc":
            continue
        if item.is_symlink():
            continue
        if item.is_dir():
            _copy_tree(item, dest / item.name, written)
        elif item.is_file():
            shutil.copyfile(item, dest / item.name)
            written.append(dest / item.name)


def release_student(
    dest_dir: str | os.PathLike,
    source_dir: str | os.PathLike = "solutions",
    lessons_dir: str | os.PathLike | None = None,
) -> list[Path]:
    """Write the learners' bundle for a graded workshop into ``dest_dir``; return the files.

    The course root is the nearest folder above ``source_dir`` that holds ``pyproject.toml``;
    ``source_dir`` may sit in an edition's folder (``ko/solutions``: the Korean edition), which
    the bundle keeps. The bundle has the lessons (``lessons_dir``, default the ``notebooks``
    beside ``source_dir``), ``exercises/`` (a fresh release of ``source_dir``, hidden tests
    removed), the pages of ``docs/`` the lessons link, the ``course_utils`` package, the learners'
    ``pyproject.toml`` (see :func:`student_pyproject`: ``pip install -e DIR`` installs it) and
    ``README.md`` (plus ``environment.yml`` and a licence file when present). It never holds
    ``solutions/``, tests, or the grader. Raises GradingError if the sources are malformed, if
    ``dest_dir`` exists and is not empty, is the course root or lies inside the sources, the
    lessons or the package, or if a required file is missing; OSError if a file cannot be
    written.
    """
    source = Path(source_dir)
    sources = load_sources(source)
    edition = source.resolve().parent   # the course root, or an edition's folder in it (ko/)
    root = next((d for d in (edition, *edition.parents) if (d / "pyproject.toml").is_file()),
                edition)
    prefix = edition.relative_to(root)  # "" for English, "ko" for the Korean edition
    dest = Path(dest_dir)
    lessons = Path(lessons_dir) if lessons_dir is not None else edition / "notebooks"
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise GradingError(f"{dest} exists and is not an empty folder: give a new folder")
    package = root / STUDENT_PACKAGE
    inside = [dest.resolve(), *dest.resolve().parents]
    if dest.resolve() == root or any(p.resolve() in inside for p in (source, lessons, package)):
        raise GradingError(
            f"{dest}: the bundle cannot be written into the course root, the sources, the lessons "
            "or the package"
        )
    required = [root / "pyproject.toml", root / "README.md", package / "__init__.py"]
    missing = [str(path) for path in required if not path.is_file()]
    if not lessons.is_dir():
        missing.append(str(lessons))
    if missing:
        raise GradingError(f"cannot build the student bundle: missing {', '.join(missing)}")
    pyproject = student_pyproject((root / "pyproject.toml").read_text(encoding="utf-8"))

    written: list[Path] = []
    dest.mkdir(parents=True, exist_ok=True)
    # an edition keeps its folder (ko/notebooks, ko/exercises): the library tells the learner's
    # language from it (course_utils.i18n); the lessons' links reach docs/ two levels up
    _copy_tree(lessons, dest / prefix / "notebooks", written)
    (dest / prefix / "exercises").mkdir(parents=True)
    for name, src in sources.items():
        path = dest / prefix / "exercises" / name
        path.write_text(dumps(release_notebook(src.nb, src.name)), encoding="utf-8")
        written.append(path)
    _copy_tree(package, dest / STUDENT_PACKAGE, written)
    (dest / "pyproject.toml").write_text(pyproject, encoding="utf-8")
    written.append(dest / "pyproject.toml")
    for doc in sorted((root / "docs").glob("*.md")) if (root / "docs").is_dir() else []:
        if doc.name in _STUDENT_DOCS:   # the pages the lessons link
            (dest / "docs").mkdir(exist_ok=True)
            (dest / "docs" / doc.name).write_text(doc.read_text(encoding="utf-8"), encoding="utf-8")
            written.append(dest / "docs" / doc.name)
    for name in _STUDENT_FILES:
        if (root / name).is_file():
            text = (root / name).read_text(encoding="utf-8")
            if name == "environment.yml":  # the learners' package has no grade/test extras
                text = re.sub(r"-e \.\[[^\]]*\]", "-e .[lab]", text)
            (dest / name).write_text(text, encoding="utf-8")
            written.append(dest / name)
    return written
