"""The student bundle (``course-grade release --student DIR``) and the grader's separation from the
learner's package: learners get lessons, released exercises and course_utils, never a solution,
a hidden test, the tests or the grader."""

from __future__ import annotations

import ast
import contextlib
import io
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from nbcells import notebook

import course_grade
from course_grade.release import student_pyproject

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI (the grade extra has it)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "solutions"
REGION = re.compile(r"### BEGIN (SOLUTION|HIDDEN TESTS)\n(.*?)### END \1", re.S)
# Regions that any right answer writes alike may legitimately appear in a lesson or the library:
# short ones (`return x`) and one-statement ones (`return checkpoint(self.block, *args, ...)`,
# the wrapper that lesson 05 teaches and exercise 05 asks for on another architecture).
MIN_REGION_CHARS = 30


def run_cli(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = course_grade.main(list(args))
    return status, out.getvalue()


def normalized(text: str) -> str:
    return " ".join(text.split())


def cell_sources(path: Path) -> str:
    """A file's text; for a notebook, its cells' sources (as a learner sees them)."""
    if path.suffix == ".ipynb":
        return "\n".join(c.source for c in notebook(path).cells)
    return path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    dest = tmp_path_factory.mktemp("bundle") / "workshop"
    status, out = run_cli("release", "--student", str(dest), "--source", str(SOLUTIONS))
    assert status == 0, out
    return dest


def test_the_bundle_holds_what_learners_need(bundle):
    top = sorted(p.name for p in bundle.iterdir())
    assert {"notebooks", "exercises", "course_utils", "pyproject.toml", "README.md"} <= set(top)
    assert not {"solutions", "tests", "course_grade", ".ci", "Makefile"} & set(top)
    lessons = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert sorted(p.name for p in (bundle / "notebooks").glob("*.ipynb")) == lessons
    for path in sorted((ROOT / "exercises").glob("*.ipynb")):  # the released exercises, as is
        assert (bundle / "exercises" / path.name).read_bytes() == path.read_bytes()
    assert (bundle / "course_utils" / "__init__.py").is_file()
    assert not list(bundle.rglob("__pycache__")) and not list(bundle.rglob("*.pyc"))


def test_nothing_of_the_solutions_leaks_into_the_bundle(bundle):
    files = [p for p in bundle.rglob("*") if p.is_file()]
    texts = {p: normalized(cell_sources(p)) for p in files}
    solution_bytes = {p.read_bytes() for p in SOLUTIONS.rglob("*") if p.is_file()}
    assert not [p for p in files if p.read_bytes() in solution_bytes]
    assert not [p for p in files if "solutions" in p.relative_to(bundle).parts]
    regions = [(kind, path.name, body) for path in sorted(SOLUTIONS.glob("*.ipynb"))
               for kind, body in REGION.findall(cell_sources(path))]
    assert {kind for kind, _, _ in regions} == {"SOLUTION", "HIDDEN TESTS"}
    checked = [(kind, name, normalized(body)) for kind, name, body in regions
               if len(normalized(body)) >= MIN_REGION_CHARS and len(body.strip().splitlines()) > 1]
    assert len(checked) >= len(regions) // 2
    leaks = [(kind, name, body[:60], path.relative_to(bundle).as_posix())
             for kind, name, body in checked for path, text in texts.items() if body in text]
    assert not leaks
    for text in texts.values():
        assert "### BEGIN SOLUTION" not in text and "### BEGIN HIDDEN TESTS" not in text


def test_the_bundle_installs_without_the_grader(bundle, tmp_path):
    data = tomllib.loads((bundle / "pyproject.toml").read_text())
    assert data["tool"]["setuptools"]["packages"]["find"]["include"] == ["course_utils*"]
    assert "course-grade" not in data["project"]["scripts"]
    assert not {"grade", "test"} & set(data["project"]["optional-dependencies"])
    assert "tool" in data and "pytest" not in data["tool"]
    assert "-e .[lab]" in (bundle / "environment.yml").read_text()
    build = tmp_path / "src"
    subprocess.run(["cp", "-r", str(bundle), str(build)], check=True)  # builds write into it
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "wheel"), str(build)], check=True, timeout=300)
    wheel = next((tmp_path / "wheel").glob("course_utils-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(tmp_path / "site")
    assert "course_utils/__init__.py" in names
    assert "course_utils/plots/__init__.py" in names  # subpackages ship too
    assert not [n for n in names if n.startswith(("course_grade/", "solutions/", "tests/"))]
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "course-grade" not in (tmp_path / "site" / entry_points).read_text()
    site = str(tmp_path / "site")
    check = (f"import sys; sys.path.insert(0, {site!r}); import course_utils, course_utils.plots; "
             f"assert course_utils.__file__.startswith({site!r}), course_utils.__file__; "
             "assert 'course_grade' not in sys.modules")
    subprocess.run([sys.executable, "-c", check], check=True, timeout=120, cwd=tmp_path)


def test_the_learners_package_never_imports_the_grader():
    for path in sorted((ROOT / "course_utils").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not [n for n in names if n.split(".")[0] == "course_grade"], path
    assert not (ROOT / "course_utils" / "grading.py").exists()


def test_a_used_or_unsafe_bundle_folder_is_refused(tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    status, _ = run_cli("release", "--student", str(tmp_path / "full"), "--source", str(SOLUTIONS))
    assert status == 2
    assert "not an empty folder" in capsys.readouterr().err
    assert (tmp_path / "full" / "notes.txt").read_text() == "mine"
    inside = SOLUTIONS / "bundle"
    assert run_cli("release", "--student", str(inside), "--source", str(SOLUTIONS))[0] == 2
    assert "cannot be written into" in capsys.readouterr().err and not inside.exists()


def test_the_learners_pyproject_refuses_an_unknown_layout():
    with pytest.raises(course_grade.GradingError, match="cannot derive"):
        student_pyproject('[project]\nname = "x"\n')
