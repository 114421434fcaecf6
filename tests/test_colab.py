"""Colab and workshops: the one repository URL, the badges and setup cells generated from it,
the setup cell in a fresh venv, the T4 guide's facts, `make course`'s JupyterLab and git filter."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from course_utils import colab
from course_utils.config import config_for, size_profile
from course_utils.experiments import ladder
from course_utils.guard import check_feasible
from course_utils.hardware import HardwareInfo, recommend_precision

ROOT = Path(__file__).resolve().parents[1]
URL = colab.repo_url(ROOT)
T4 = HardwareInfo(device="cuda", name="Tesla T4", compute_capability=(7, 5), native_bf16=False,
                  fp16_fast=True, total_memory_bytes=15 * 2**30, bf16_emulated=True)


def _release(source, dest):
    try:
        from course_grade import release
    except ImportError:
        from course_utils.grading import release
    release(source, dest)


@pytest.fixture
def copy(tmp_path):
    """A copy of the repository's notebooks, README and pyproject.toml."""
    for name in ("notebooks", "solutions", "exercises"):
        shutil.copytree(ROOT / name, tmp_path / name)
    for name in ("README.md", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def _cells(path):
    return json.loads(Path(path).read_text(encoding="utf-8"))["cells"]


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
        colab.repo_url(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    with pytest.raises(ValueError, match=r"\[project.urls\] Repository"):
        colab.repo_url(tmp_path)
    assert colab._toml_fallback((ROOT / "pyproject.toml").read_text()) == {
        "project": {"urls": {"Repository": URL}, "dependencies": colab.requirements(ROOT)}}


def test_repository_badges_and_setup_cells_agree_with_the_url():
    """Fails until `python -m course_utils.colab` and `course-grade release` have been run."""
    problems = colab.sync(ROOT, check=True)
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- the command

def _unapply(path):
    """Remove the setup cell and the badge, as in a notebook the command never touched."""
    nb = json.loads(path.read_text())
    nb["cells"] = [c for c in nb["cells"] if c["id"] != colab.SETUP_ID]
    for c in nb["cells"]:
        text = "".join(c["source"])
        if c["cell_type"] == "markdown" and colab._BADGE_RE.search(text):
            c["source"] = colab._lines(colab._BADGE_RE.sub("", text).replace("\n\n\n", "\n\n"))
    path.write_text(colab._dumps(nb))


def test_sync_writes_badges_and_setup_cells_idempotently(copy):
    for p in copy.rglob("*.ipynb"):
        _unapply(p)
    before = {p: _cells(p) for d in ("notebooks", "solutions") for p in sorted((copy / d).glob("*.ipynb"))}
    assert colab.sync(copy, check=True)              # nothing applied yet: disagreements
    colab.sync(copy)
    _release(copy / "solutions", copy / "exercises")
    assert colab.sync(copy, check=True) == []
    texts = {p: p.read_bytes() for p in copy.rglob("*.ipynb")}
    assert colab.sync(copy) == []                    # a second run changes nothing
    assert texts == {p: p.read_bytes() for p in copy.rglob("*.ipynb")}
    cell = colab.setup_cell_source(URL)
    for path, old in before.items():
        new = _cells(path)
        ids = [c["id"] for c in new]
        assert [i for i in ids if i != colab.SETUP_ID] == [c["id"] for c in old], "ids kept"
        setup = next(c for c in new if c["cell_type"] == "code")
        assert setup["id"] == colab.SETUP_ID and "".join(setup["source"]) == cell
        assert ids.index(colab.SETUP_ID) <= 2                         # after title / objectives
        assert "objective" in "".join(new[0]["source"] + new[1]["source"]).lower()
        target = colab.badge_target(path.relative_to(copy))
        assert f"({colab.colab_url(URL, target)})" in "".join(new[0]["source"])
    for path in sorted((copy / "exercises").glob("*.ipynb")):
        title = "".join(_cells(path)[0]["source"])
        assert f"/blob/main/exercises/{path.name})" in title          # learners open exercises
        assert "/solutions/" not in title
    r = subprocess.run([sys.executable, "-m", "nbstripout", "--verify", "--keep-id",
                        *map(str, sorted(copy.rglob("*.ipynb")))], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_check_reports_a_changed_url_and_an_edited_cell(copy):
    colab.sync(copy)
    _release(copy / "solutions", copy / "exercises")
    nb = copy / "notebooks" / sorted(p.name for p in (copy / "notebooks").glob("*.ipynb"))[0]
    data = json.loads(nb.read_text())
    setup = next(c for c in data["cells"] if c["id"] == colab.SETUP_ID)
    setup["source"] = setup["source"][:-1]
    nb.write_text(colab._dumps(data))
    assert [p.split(":")[0] for p in colab.sync(copy, check=True)] == [f"notebooks/{nb.name}"]
    pyproject = copy / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(URL, "https://github.com/fork/course"))
    problems = colab.sync(copy, check=True)
    n = sum(1 for d in ("notebooks", "solutions", "exercises") for _ in (copy / d).glob("*.ipynb"))
    assert len(problems) == n + 1 and problems[-1].startswith("README.md")
    assert subprocess.run([sys.executable, "-m", "course_utils.colab", "--check", "--root",
                           str(copy)], capture_output=True).returncode == 1


def test_a_second_badge_or_setup_cell_is_merged_or_refused():
    nb = {"cells": [{"cell_type": "markdown", "id": "t", "metadata": {}, "source": ["# T\n", "objectives"]},
                    {"cell_type": "markdown", "id": "b", "metadata": {},
                     "source": [colab.badge(URL, "notebooks/x.ipynb") + "\n", "\n", "text"]},
                    {"cell_type": "code", "id": "c", "metadata": {}, "source": ["1"],
                     "outputs": [], "execution_count": None}], "metadata": {}}
    out = colab.apply_to_notebook(nb, URL, "notebooks/y.ipynb")
    texts = ["".join(c["source"]) for c in out["cells"]]
    assert sum("colab-badge.svg" in t for t in texts) == 1 and "notebooks/y.ipynb" in texts[0]
    assert texts[2] == "text" and [c["id"] for c in out["cells"]] == ["t", "colab-setup", "b", "c"]
    twice = colab.apply_to_notebook(out, URL, "notebooks/y.ipynb")
    twice["cells"].append(dict(twice["cells"][1]))
    with pytest.raises(ValueError, match="2 cells have the id"):
        colab.apply_to_notebook(twice, URL, "notebooks/y.ipynb")


def test_readme_blocks_are_generated(copy):
    readme = copy / "README.md"
    readme.write_text(readme.read_text().replace("| fp32 |", "| fp32 (edited) |"))
    assert colab.sync(copy, check=True, parts=("readme",)) == [
        "README.md: its Colab badges or T4 estimate are out of date (run `python -m course_utils.colab`)"]
    colab.sync(copy, parts=("readme",))
    text = readme.read_text()
    assert colab.sync(copy, check=True, parts=("readme",)) == []
    for d in ("notebooks", "exercises"):
        for p in (copy / d).glob("[0-9][0-9]_*.ipynb"):
            assert colab.badge(URL, f"{d}/{p.name}") in text
    readme.write_text("no blocks")
    with pytest.raises(ValueError, match="no block"):
        colab.sync(copy, parts=("readme",))


# --------------------------------------------------------------------------- the setup cell

def _fake_pip(calls, fail=()):
    def run(args):
        calls.append(args)
        bad = any(a in fail for a in args)
        return SimpleNamespace(returncode=1 if bad else 0, stdout="", stderr="ERROR: no network\n")
    return run


def test_install_missing_never_touches_torch_or_a_present_ipywidgets(monkeypatch):
    present = {"torch", "numpy", "ipywidgets", "tqdm"}
    monkeypatch.setattr(colab, "_importable", lambda name: name.lower() in present)
    calls, said = [], []
    report = colab.install_missing(ROOT, run=_fake_pip(calls), say=said.append)
    assert calls[0] == ["install", "--quiet", "--no-deps", "-e", str(ROOT)]
    assert len(calls) == 2 and calls[1][:2] == ["install", "--quiet"]
    wanted = calls[1][2:calls[1].index("-c")]
    assert [colab._name(s) for s in wanted] == ["pandas", "matplotlib"]
    assert not any(colab._name(s) in ("torch", "ipywidgets") for s in wanted)
    assert report.installed == wanted and set(report.kept) == present
    assert any(s.startswith("already installed, left as they are: torch") for s in said)
    assert said[-1] == f"installed what was missing: {', '.join(wanted)}"


def test_install_missing_pins_torch_and_reports_failures(monkeypatch):
    import torch
    monkeypatch.setattr(colab, "_importable", lambda name: name.lower() != "pandas")
    seen = {}

    def run(args):
        if "-c" in args:
            seen["constraints"] = Path(args[args.index("-c") + 1]).read_text()
        return SimpleNamespace(returncode=1 if "-c" in args or "-e" in args else 0,
                               stdout="", stderr="ERROR: no network\n")
    said = []
    with pytest.raises(RuntimeError, match="could not install pandas"):
        colab.install_missing(ROOT, run=run, say=said.append)
    assert seen["constraints"] == f"torch=={colab._version('torch')}\n"
    assert torch.__version__.split("+")[0] in seen["constraints"]
    assert said[0].startswith("could not pip-install the course (ERROR: no network)")
    monkeypatch.setattr(colab, "_importable", lambda name: name.lower() != "torch")
    calls = []
    with pytest.raises(RuntimeError, match="torch is not installed"):
        colab.install_missing(ROOT, run=_fake_pip(calls), say=said.append)
    assert calls == []


def test_setup_cell_where_course_utils_imports_only_describes(capsys):
    exec(colab.setup_cell_source(URL), {})
    out = capsys.readouterr().out
    assert "fetching" not in out and "pip" not in out
    assert out.startswith("course_utils from ")
    assert "recipe" in out and f"size profile {size_profile()}" in out


def _purelib_shadow(tmp_path):
    """Symlinks to this venv's packages, less the course: what Colab has preinstalled."""
    shadow = tmp_path / "preinstalled"
    shadow.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        n = entry.name.lower()
        if "course_utils" in n or "course_grade" in n or n.endswith(".pth") or n == "__pycache__":
            continue
        (shadow / entry.name).symlink_to(entry)
    return shadow


@pytest.mark.timeout(600)
def test_setup_cell_in_a_fresh_venv_imports_course_utils_without_a_restart(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient
    src = tmp_path / "origin"   # stands in for the repository URL
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(src)], check=True)
    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "_preinstalled.pth").write_text(f"{_purelib_shadow(tmp_path)}\n")
    kernels = tmp_path / "jupyter" / "kernels" / "fresh"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "fresh venv", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    work = tmp_path / "content"  # Colab's working folder
    work.mkdir()

    lesson = sorted((ROOT / "notebooks").glob("01_*.ipynb"))[0]
    cell = next((c for c in _cells(lesson) if c.get("id") == colab.SETUP_ID), None)
    source = "".join(cell["source"]) if cell else colab.setup_cell_source(URL)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source),
                nbformat.v4.new_code_cell(
                    "import importlib.metadata, sys, torch, course_utils\n"
                    "from course_utils.config import config_for\n"
                    "print('FILE', course_utils.__file__)\n"
                    "print('TORCH', torch.__file__)\n"
                    "print('PREFIX', sys.prefix)\n"
                    "print('CFG', config_for().label)\n")]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(COURSE_SOURCE=f"file://{src}", COURSE_SIZE="smoke", OMP_NUM_THREADS="1",
               PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    client = NotebookClient(nb, kernel_name="fresh", timeout=500,
                            resources={"metadata": {"path": str(work)}})
    client.execute(env=env)
    out = ["".join(o.get("text", "") for o in c.outputs if o.output_type == "stream") for c in nb.cells]
    errors = [o for c in nb.cells for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    print(out[0])
    checkout = work / URL.rsplit("/", 1)[1]
    assert f"fetching the course: git clone --depth=1 file://{src} {checkout}" in out[0]
    assert f"course_utils imports in this kernel from {checkout}" in out[0]
    assert ("installed the course: pip install --no-deps -e" in out[0]
            or "could not pip-install the course" in out[0])
    assert re.search(r"already installed, left as they are: torch [\d.]+", out[0])
    assert "nothing else was missing" in out[0] and "size profile smoke" in out[0]
    assert f"FILE {checkout}/course_utils/__init__.py" in out[1]
    assert f"TORCH {tmp_path / 'preinstalled'}" in out[1]        # torch untouched
    assert f"PREFIX {venv}" in out[1] and "CFG fp32" in out[1]


# --------------------------------------------------------------------------- the T4 guide

def test_t4_guide_facts(monkeypatch, capsys):
    monkeypatch.delenv("COURSE_SIZE", raising=False)
    rec = recommend_precision(T4)
    assert (rec.precision, rec.grad_scaler) == ("fp16", True)
    assert size_profile(T4) == "t4"
    cfg = config_for("t4", device="cuda")
    assert [c.label for c in ladder(cfg, T4)] == ["fp32", "fp16", "fp16+full", "fp16+selective"]
    with pytest.raises(ValueError, match="bf16 on Tesla T4 is emulated"):
        check_feasible(cfg.replace(precision="bf16"), T4)
    text = colab.describe_setup(T4)
    assert "recipe fp16 autocast + GradScaler; bf16 emulated here; size profile t4" in text
    readme = (ROOT / "README.md").read_text()
    assert "fp32 → fp16 + GradScaler → + full checkpointing / + selective checkpointing" in readme


def test_t4_estimate_follows_flops_and_memory():
    df = colab.t4_estimate().set_index("configuration")
    fp32, fp16 = df.loc["fp32"], df.loc["fp16 + GradScaler"]
    assert fp16.step_ms < fp32.step_ms / 2             # tensor cores: 65 vs 8.1 TFLOPS peak
    full = df.loc["fp16 + full checkpointing"]
    assert full.step_ms > fp16.step_ms * 0.9 and full.peak_GiB < fp16.peak_GiB
    assert df.peak_GiB.max() < colab.T4.memory_gib     # the t4 profile fits a T4
    assert not df.loc["bf16 (emulated on a T4: refused)"].in_ladder


def test_optional_import_says_how_to_install(capsys):
    assert colab.optional_import("json", "hf", "x") is json
    assert colab.optional_import("no_such_module_for_the_course", "hf", "the Hugging Face "
                                 "section") is None
    out = capsys.readouterr().out
    assert "the Hugging Face section is skipped" in out and 'pip install -e ".[hf]"' in out


# --------------------------------------------------------------------------- make course

BIN = Path(sys.executable).parent
needs_make = pytest.mark.skipif(shutil.which("make") is None or not (BIN / "nbstripout").exists(),
                                reason="needs make and nbstripout (make test installs both)")


def test_make_course_installs_only_the_runtime_and_torch_first(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("needs make")
    venv = tmp_path / "v"   # a venv that does not exist: make prints the whole recipe
    course = subprocess.run(["make", "-n", "setup", f"VENV={venv}"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout
    installs = [line for line in course.splitlines() if "pip install" in line]
    assert "torch==2.13.0" in installs[1] and "import torch" in installs[1]   # after pip itself
    assert installs[2].endswith('-e ".[lab,hf]"') and len(installs) == 3
    assert "nbstripout --install --attributes .gitattributes" in course
    full = subprocess.run(["make", "-n", "setup-test", f"VENV={venv}"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    assert '-e ".[lab,hf,grade,test]"' in full
    project = colab._toml(ROOT / "pyproject.toml")["project"]
    names = [colab._name(s) for s in project["dependencies"]]
    assert "transformers" not in names and "torch" in names
    extras = {k: [colab._name(s) for s in v] for k, v in project["optional-dependencies"].items()}
    assert extras["hf"] == ["transformers"]
    assert {"jupyterlab", "ipykernel", "nbstripout"} <= set(extras["lab"])
    assert not {"pytest", "nbval", "playwright", "ruff"} & set(extras["lab"] + names)
    assert {"pytest", "pytest-xdist", "nbval", "nbstripout", "playwright", "ruff"} <= set(extras["test"])


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(base, token, path, body=None):
    req = urllib.request.Request(f"{base}/api/contents/{path}", method="PUT" if body else "GET",
                                 data=json.dumps(body).encode() if body else None,
                                 headers={"Authorization": f"token {token}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


@needs_make
@pytest.mark.skipif(not (BIN / "jupyter-lab").exists(), reason="needs JupyterLab ([lab])")
def test_make_lab_serves_the_root_on_lesson_01_and_saves_keep_git_clean(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    time.sleep(1.1)  # as `make course` installs first: the clone's files are a second old or more
    attributes = (clone / ".gitattributes").read_text()
    subprocess.run(["make", "-s", "git-filter", f"BIN={BIN}"], cwd=clone, check=True,
                   capture_output=True)
    assert (clone / ".gitattributes").read_text() == attributes        # already complete
    clean = subprocess.run(["git", "config", "filter.nbstripout.clean"], cwd=clone,
                           capture_output=True, text=True).stdout
    assert clean.strip().endswith("-m nbstripout --keep-id")
    port, token = _free_port(), "course-test-token"
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "ws"), JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"))
    args = f"--no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port={port} " \
           f"--IdentityProvider.token={token}"
    proc = subprocess.Popen(["make", "-s", "lab", f"BIN={BIN}", f"LAB_ARGS={args}"], cwd=clone,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        base, listing = f"http://127.0.0.1:{port}", None
        for _ in range(240):
            try:
                listing = _api(base, token, "")
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.5)
        assert listing is not None, "JupyterLab did not start"
        assert {"notebooks", "exercises", "README.md"} <= {c["name"] for c in listing["content"]}
        assert {c["name"] for c in _api(base, token, "exercises")["content"]} == \
            {p.name for p in (clone / "exercises").glob("*.ipynb")}
        lesson = sorted((clone / "notebooks").glob("01_*.ipynb"))[0].name
        opened = list((tmp_path / "rt").glob("jpserver-file-to-run-*-open.html"))
        assert opened and f"/lab/tree/notebooks/{lesson}" in opened[0].read_text()

        def status():
            return subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True,
                                  text=True, check=True).stdout
        # Save the lesson as JupyterLab does after a run: outputs, counts, kernel metadata.
        nb = _api(base, token, f"notebooks/{lesson}")["content"]
        ids = [c["id"] for c in nb["cells"]]
        for n, c in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
            c["execution_count"] = n + 1
            c["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "ran\n"}]
        nb["metadata"]["language_info"].update(version="3.11.7", mimetype="text/x-python",
                                               file_extension=".py", pygments_lexer="ipython3")
        _api(base, token, f"notebooks/{lesson}", {"type": "notebook", "format": "json", "content": nb})
        saved = json.loads((clone / "notebooks" / lesson).read_text())
        assert any(c.get("outputs") for c in saved["cells"])        # the outputs are in the file
        for _ in range(600):                                        # the hook runs in the background
            if status() == "":
                break
            time.sleep(0.5)
        assert status() == ""                                       # and not in git's view
        subprocess.run(["git", "add", "-A"], cwd=clone, check=True)
        staged = json.loads(subprocess.run(["git", "show", f":notebooks/{lesson}"], cwd=clone,
                                           capture_output=True, text=True, check=True).stdout)
        assert [c["id"] for c in staged["cells"]] == ids            # --keep-id
        assert not any(c.get("outputs") for c in staged["cells"])
        nb["cells"][0]["source"] = "# a real edit stays visible\n"
        _api(base, token, f"notebooks/{lesson}", {"type": "notebook", "format": "json", "content": nb})
        time.sleep(5)
        assert status().split() == ["M", f"notebooks/{lesson}"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


# --------------------------------------------------------------------------- docs

def test_docstrings_and_docs_cite_only_files_in_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    names = {Path(t).name for t in tracked} | set(tracked)
    bad = []
    for path in [*sorted((ROOT / "course_utils").rglob("*.py")), *sorted((ROOT / "tests").glob("*.py")),
                 ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        if re.search(r"shared[/ ]notes", text):
            bad.append(f"{path.relative_to(ROOT)} cites the team's notes, not in the repository")
        for ref in re.findall(r"[\w./-]*[\w-]\.md\b", text):
            if ref.lstrip("./") not in names and ref.split("/")[-1] not in names:
                bad.append(f"{path.relative_to(ROOT)} cites {ref}, not in the repository")
    assert not bad, "\n".join(bad)
