"""House rules that keep the repository usable: clean notebooks, numbered lessons."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for d in ("notebooks", "solutions", "exercises")
                   for p in (ROOT / d).glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_is_committed_stripped(path):
    """nbstripout --keep-id would change nothing: no outputs, no execution counts."""
    r = subprocess.run([sys.executable, "-m", "nbstripout", "--verify", "--keep-id", str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"{path.name} has outputs: run nbstripout --keep-id on it"
    nb = json.loads(path.read_text())
    assert all("id" in c for c in nb["cells"]), "every cell needs a stable id (the grader uses it)"


def test_lessons_are_numbered_and_start_with_objectives():
    lessons = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert lessons, "no lesson notebooks found"
    for path in lessons:
        nb = json.loads(path.read_text())
        first = "".join(nb["cells"][0]["source"]) + "".join(nb["cells"][1]["source"])
        assert "objective" in first.lower(), f"{path.name}: list the learning objectives first"
