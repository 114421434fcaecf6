"""The maintainer's Colab tool (tools/colab_cells.py): the one repository URL and release ref,
the badges, setup cells and Colab GPU metadata generated from them (idempotent, nbstripout-clean),
the README's generated blocks, the release check, and the T4 estimate."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from nbcells import notebook

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import colab_cells as cells  # noqa: E402

URL = cells.repo_url(ROOT)
REF = cells.release_ref(ROOT)
TOOL = ROOT / "tools" / "colab_cells.py"
REAL = "https://github.com/some-school/amp-checkpointing-course"


def _release(source, dest):
    from course_grade import release
    release(source, dest)


@pytest.fixture
def copy(tmp_path):
    """A copy of the repository's notebooks, docs, README and pyproject.toml."""
    for name in ("notebooks", "solutions", "exercises", "docs"):
        shutil.copytree(ROOT / name, tmp_path / name)
    for name in ("README.md", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def _set_url(root, url):
    pyproject = root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(URL, url))


def _tool(*args):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True)


# --------------------------------------------------------------------------- the one URL

def test_url_is_declared_once_in_pyproject():
    assert URL.startswith("https://github.com/")
    text = (ROOT / "pyproject.toml").read_text()
    assert text.count(URL) == 1
    # Nothing else in the repository's own files types another GitHub URL for the course.
    name = URL.rsplit("/", 1)[1]
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                 *sorted((ROOT / "course_utils").rglob("*.py"))]:
        for found in re.findall(r"github\.com/[\w.-]+/" + re.escape(name), path.read_text()):
            assert found == URL.removeprefix("https://"), f"{path.name} names {found}"


def test_repo_url_refuses_what_colab_cannot_open(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project.urls]\nRepository = "https://gitlab.com/a/b"\n')
    with pytest.raises(ValueError, match="github.com/OWNER/NAME"):
        cells.repo_url(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    with pytest.raises(ValueError, match=r"\[project.urls\] Repository"):
        cells.repo_url(tmp_path)
    with pytest.raises(ValueError, match=r"no \[project\] version"):
        cells.release_ref(tmp_path)
    from course_utils import colab
    assert colab._toml_fallback((ROOT / "pyproject.toml").read_text()) == {
        "project": {"urls": {"Repository": URL}, "dependencies": colab.requirements(ROOT),
                    "version": REF.removeprefix("v")}}


def test_the_placeholder_is_never_written_into_a_setup_cell():
    assert cells.is_placeholder(cells.PLACEHOLDER_URL + ".git") and not cells.is_placeholder(REAL)
    placeholder = cells.setup_cell_source(cells.PLACEHOLDER_URL, "v1.2.3")
    assert "COURSE_URL = None" in placeholder and "github.com/amp-course" not in placeholder
    real = cells.setup_cell_source(REAL, "v1.2.3")
    assert f'COURSE_URL = "{REAL}"' in real
    assert 'COURSE_REF = os.environ.get("COURSE_REF", "v1.2.3")' in real
    assert os_abspath(real) == "amp-checkpointing-course"
    for source in (placeholder, real):
        compile(source, "setup cell", "exec")


def os_abspath(source):
    return re.search(r'_checkout = os\.path\.abspath\("([^"]+)"\)', source).group(1)


def test_repository_badges_setup_cells_and_metadata_agree_with_pyproject():
    """Fails until `python tools/colab_cells.py` and `course-grade release` have been run."""
    problems = cells.sync(ROOT, check=True)
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- the command

def _unapply(path):
    """Remove the setup cell, the badge and Colab's metadata, as in a notebook the tool never
    touched."""
    nb = json.loads(path.read_text())
    nb["cells"] = [c for c in nb["cells"] if c["id"] != cells.SETUP_ID]
    for c in nb["cells"]:
        text = "".join(c["source"])
        if c["cell_type"] == "markdown" and cells._BADGE_RE.search(text):
            c["source"] = cells._lines(cells._BADGE_RE.sub("", text).replace("\n\n\n", "\n\n"))
    nb["metadata"].pop("accelerator", None)
    nb["metadata"].pop("colab", None)
    path.write_text(cells._dumps(nb))


def test_sync_writes_badges_setup_cells_and_metadata_idempotently(copy):
    for p in copy.rglob("*.ipynb"):
        _unapply(p)
    before = {p: notebook(p).cells for d in ("notebooks", "solutions")
              for p in sorted((copy / d).glob("*.ipynb"))}
    assert cells.sync(copy, check=True)              # nothing applied yet: disagreements
    cells.sync(copy)
    _release(copy / "solutions", copy / "exercises")
    assert cells.sync(copy, check=True) == []
    texts = {p: p.read_bytes() for p in copy.rglob("*.ipynb")}
    assert cells.sync(copy) == []                    # a second run changes nothing
    assert texts == {p: p.read_bytes() for p in copy.rglob("*.ipynb")}
    cell = cells.setup_cell_source(URL, REF)
    for path, old in before.items():
        new = notebook(path).cells
        ids = [c["id"] for c in new]
        assert [i for i in ids if i != cells.SETUP_ID] == [c["id"] for c in old], "ids kept"
        setup = next(c for c in new if c["cell_type"] == "code")
        assert setup["id"] == cells.SETUP_ID and "".join(setup["source"]) == cell
        assert ids.index(cells.SETUP_ID) <= 2                         # after title / objectives
        assert "objective" in "".join(new[0]["source"] + new[1]["source"]).lower()
        target = cells.badge_target(path.relative_to(copy))
        assert f"({cells.colab_url(URL, target)})" in "".join(new[0]["source"])
    for path in sorted(copy.rglob("*.ipynb")):
        meta = json.loads(path.read_text())["metadata"]
        assert meta["accelerator"] == "GPU" and meta["colab"] == {"gpuType": "T4", "provenance": []}
        assert meta["kernelspec"]["name"] == "python3"                # other metadata kept
    for path in sorted((copy / "exercises").glob("*.ipynb")):
        title = notebook(path).cells[0].source
        assert f"/blob/main/exercises/{path.name})" in title          # learners open exercises
        assert "/solutions/" not in title
    r = subprocess.run([sys.executable, "-m", "nbstripout", "--verify", "--keep-id",
                        *map(str, sorted(copy.rglob("*.ipynb")))], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_colab_metadata_survives_nbstripout_and_the_git_filter(copy):
    """nbstripout as the Makefile's git filter runs it (--keep-id and the language_info keys):
    a notebook saved with outputs comes back with Colab's GPU metadata and nothing else changed."""
    make = (ROOT / "Makefile").read_text()
    keys = re.search(r"LANGUAGE_INFO_KEYS := \$\(foreach k,(.*?),metadata", make, re.S).group(1)
    extra = " ".join(f"metadata.language_info.{k}" for k in keys.replace("\\\n", " ").split())
    nb_path = copy / "notebooks" / sorted(p.name for p in (copy / "notebooks").glob("*.ipynb"))[0]
    clean = nb_path.read_text()
    nb = json.loads(clean)
    for c in nb["cells"]:
        if c["cell_type"] == "code":
            c["outputs"], c["execution_count"] = [{"output_type": "stream", "name": "stdout",
                                                   "text": "ran\n"}], 1
    nb["metadata"]["language_info"].update(version="3.12.1", pygments_lexer="ipython3")
    nb_path.write_text(json.dumps(nb))
    subprocess.run([sys.executable, "-m", "nbstripout", "--keep-id", "--extra-keys", extra,
                    str(nb_path)], check=True)
    assert nb_path.read_text() == clean


def test_check_reports_a_changed_url_version_or_edited_cell(copy):
    cells.sync(copy)
    _release(copy / "solutions", copy / "exercises")
    nb = copy / "notebooks" / sorted(p.name for p in (copy / "notebooks").glob("*.ipynb"))[0]
    data = json.loads(nb.read_text())
    setup = next(c for c in data["cells"] if c["id"] == cells.SETUP_ID)
    setup["source"] = setup["source"][:-1]
    nb.write_text(cells._dumps(data))
    assert [p.split(":")[0] for p in cells.sync(copy, check=True)] == [f"notebooks/{nb.name}"]
    n = sum(1 for d in ("notebooks", "solutions", "exercises") for _ in (copy / d).glob("*.ipynb"))
    _set_url(copy, "https://github.com/fork/course")
    problems = cells.sync(copy, check=True)
    assert len(problems) == n + 1 and problems[-1].startswith("README.md")
    assert _tool("--check", "--root", copy).returncode == 1
    _set_url(copy, URL)
    cells.sync(copy)
    _release(copy / "solutions", copy / "exercises")
    pyproject = copy / "pyproject.toml"
    pyproject.write_text(re.sub(r'(?m)^version = ".*"$', 'version = "9.9.9"', pyproject.read_text()))
    problems = cells.sync(copy, check=True)                            # the ref is in every cell
    assert len(problems) == n and all("setup cell" in p for p in problems)


def test_a_second_badge_or_setup_cell_is_merged_or_refused():
    nb = {"cells": [{"cell_type": "markdown", "id": "t", "metadata": {}, "source": ["# T\n", "objectives"]},
                    {"cell_type": "markdown", "id": "b", "metadata": {},
                     "source": [cells.badge(URL, "notebooks/x.ipynb") + "\n", "\n", "text"]},
                    {"cell_type": "code", "id": "c", "metadata": {}, "source": ["1"],
                     "outputs": [], "execution_count": None}], "metadata": {}}
    out = cells.apply_to_notebook(nb, URL, "notebooks/y.ipynb", REF)
    texts = ["".join(c["source"]) for c in out["cells"]]
    assert sum("colab-badge.svg" in t for t in texts) == 1 and "notebooks/y.ipynb" in texts[0]
    assert texts[2] == "text" and [c["id"] for c in out["cells"]] == ["t", "colab-setup", "b", "c"]
    twice = cells.apply_to_notebook(out, URL, "notebooks/y.ipynb", REF)
    twice["cells"].append(dict(twice["cells"][1]))
    with pytest.raises(ValueError, match="2 cells have the id"):
        cells.apply_to_notebook(twice, URL, "notebooks/y.ipynb", REF)


def test_readme_blocks_are_generated(copy):
    readme = copy / "README.md"
    readme.write_text(readme.read_text().replace("| fp32 |", "| fp32 (edited) |"))
    assert cells.sync(copy, check=True, parts=("readme",)) == [
        "README.md: its Colab badges or T4 estimate are out of date (run `python tools/colab_cells.py`)"]
    cells.sync(copy, parts=("readme",))
    text = readme.read_text()
    assert cells.sync(copy, check=True, parts=("readme",)) == []
    for d in ("notebooks", "exercises"):
        for p in (copy / d).glob("[0-9][0-9]_*.ipynb"):
            assert cells.badge(URL, f"{d}/{p.name}") in text
    readme.write_text("no blocks")
    with pytest.raises(ValueError, match="no block"):
        cells.sync(copy, parts=("readme",))


# --------------------------------------------------------------------------- the release check

def _git(root, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args], cwd=root,
                   check=True, capture_output=True)


def test_release_check_refuses_the_placeholder_a_stray_badge_and_a_missing_tag(copy, capsys):
    def release_check():
        capsys.readouterr()
        code = cells.main(["--release-check", "--root", str(copy)])
        return code, capsys.readouterr().out

    _git(copy, "init", "-q")
    r = _tool("--release-check", "--root", copy)                   # the command's exit status
    if cells.is_placeholder(URL):                  # today's repository: not releasable
        assert r.returncode == 1 and "is the placeholder" in r.stdout
    _set_url(copy, REAL)
    assert release_check()[0] == 1                                 # cells still say the old URL
    assert cells.main(["--root", str(copy)]) == 0
    _release(copy / "solutions", copy / "exercises")
    _git(copy, "add", "-A")
    _git(copy, "commit", "-qm", "release")
    assert release_check() == (1, f"the setup cells clone the tag {REF} (v + pyproject.toml's "
                               f"version), which this checkout does not have: commit, then "
                               f"`git tag {REF}` and push the tag with the release\n")
    _git(copy, "tag", REF)
    assert release_check() == (0, f"ready to release: {REAL} at {REF}\n")
    for path in sorted((copy / "notebooks").glob("*.ipynb")):
        assert "COURSE_URL = \\\"" + REAL in path.read_text()
    guide = copy / "docs" / "workshop.md"
    guide.write_text(guide.read_text() + "\n" + cells.badge(URL.replace(
        cells._owner_name(URL).split("/")[0], "someone-else"), "notebooks/x.ipynb") + "\n")
    code, out = release_check()
    assert code == 1 and out.startswith("docs/workshop.md: a Colab link opens someone-else/")


# --------------------------------------------------------------------------- the T4 estimate

def test_t4_estimate_follows_flops_and_memory(capsys):
    df = cells.t4_estimate().set_index("configuration")
    fp32, fp16 = df.loc["fp32"], df.loc["fp16 + GradScaler"]
    assert fp16.step_ms < fp32.step_ms / 2             # tensor cores: 65 vs 8.1 TFLOPS peak
    full = df.loc["fp16 + full checkpointing"]
    assert full.step_ms > fp16.step_ms * 0.9 and full.peak_GiB < fp16.peak_GiB
    assert df.peak_GiB.max() < cells.T4.memory_gib     # the t4 profile fits a T4
    assert not df.loc["bf16 (emulated on a T4: refused)"].in_ladder
    assert cells.main(["--t4"]) == 0
    out = capsys.readouterr().out
    assert "fp16 + GradScaler" in out and "step_ms" in out


def test_the_setup_cell_is_collapsed_to_one_title_line_in_every_notebook():
    """Issue 24: the setup cell stays complete but out of the way: Colab's form view shows its
    ``#@title`` line, JupyterLab hides its source (nbstripout keeps both: the test above)."""
    paths = sorted(ROOT.glob("notebooks/*.ipynb")) + sorted(ROOT.glob("solutions/*.ipynb")) \
        + sorted(ROOT.glob("exercises/*.ipynb"))
    assert paths
    for path in paths:
        setup = next(c for c in json.loads(path.read_text())["cells"] if c["id"] == cells.SETUP_ID)
        assert "".join(setup["source"]).splitlines()[0] == cells.SETUP_TITLE, path.name
        assert setup["metadata"]["cellView"] == "form", path.name
        assert setup["metadata"]["jupyter"]["source_hidden"] is True, path.name
