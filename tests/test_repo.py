"""House rules that keep the repository usable: clean notebooks, ruff over everything, and the
pre-commit hooks that run the same checks before a commit."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for d in ("notebooks", "solutions", "exercises")
                   for p in (ROOT / d).glob("*.ipynb"))


@pytest.fixture(scope="module")
def would_strip():
    """The notebooks that ``nbstripout --verify --keep-id`` would change, from one run over all of
    them (each nbstripout start imports nbformat, seconds on a slow machine)."""
    r = subprocess.run([sys.executable, "-m", "nbstripout", "--verify", "--keep-id", *map(str, NOTEBOOKS)],
                       capture_output=True, text=True)
    assert r.returncode in (0, 1), r.stderr
    named = {line.split("would have stripped", 1)[1].strip() for line in r.stdout.splitlines()
             if "would have stripped" in line}
    assert (r.returncode == 1) == bool(named), r.stdout + r.stderr
    return {Path(p).resolve() for p in named}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_is_committed_stripped(path, would_strip):
    """nbstripout --keep-id would change nothing: no outputs, no execution counts."""
    assert path.resolve() not in would_strip, f"{path.name} has outputs: run nbstripout --keep-id on it"
    nb = json.loads(path.read_text())
    assert all("id" in c for c in nb["cells"]), "every cell needs a stable id (the grader uses it)"


def test_the_stripped_check_notices_outputs(tmp_path):
    """The check above can fail: nbstripout names a notebook that still has an output."""
    nb = json.loads(NOTEBOOKS[0].read_text())
    code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "ran\n"}]
    code["execution_count"] = 1
    dirty = tmp_path / "dirty.ipynb"
    dirty.write_text(json.dumps(nb))
    r = subprocess.run([sys.executable, "-m", "nbstripout", "--verify", "--keep-id", str(dirty)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and f"would have stripped {dirty}" in r.stdout


def test_ruff_lints_the_package_tests_tools_and_every_notebook():
    """Notebook code is code: ``ruff check .`` (pyproject's rules, notebooks included) is clean."""
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_the_pre_commit_hooks_run_what_ci_checks():
    """.pre-commit-config.yaml runs ruff (notebooks included) and nbstripout --keep-id with the
    git filter's extra keys (Makefile), both from the venv CI uses."""
    hooks = {h["id"]: h for repo in yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"]
             for h in repo["hooks"]}
    assert hooks["ruff"]["entry"].split()[:2] == [".venv/bin/ruff", "check"]
    assert "jupyter" in hooks["ruff"]["types_or"] and "python" in hooks["ruff"]["types_or"]
    strip = hooks["nbstripout"]["entry"]
    assert "-m nbstripout --keep-id" in strip and hooks["nbstripout"]["files"] == r"\.ipynb$"
    makefile = (ROOT / "Makefile").read_text()
    keys = makefile.split("LANGUAGE_INFO_KEYS := $(foreach k,", 1)[1].split(",", 1)[0].split()
    keys = [k.strip("\\") for k in keys if k.strip("\\")]
    assert keys and all(f"metadata.language_info.{k}" in strip for k in keys)
