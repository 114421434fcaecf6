"""The lesson benchmark (tools/bench_lessons.py) on tiny notebooks: per-cell times, the failing
notebook reported not raised, and the AVX2 emulation reaching the kernel."""
import json
import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import bench_lessons  # noqa: E402


def notebook(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    for i, c in enumerate(nb.cells):
        c.id = f"cell-{i}"
    nbformat.write(nb, path)
    return path


def test_times_cells_reports_errors_and_passes_the_isa_cap(tmp_path):
    ok = notebook(tmp_path / "01_ok.ipynb", "import time\ntime.sleep(0.4)", "import os\n"
                  "assert os.environ['ONEDNN_MAX_CPU_ISA'] == 'AVX2'\n"
                  "assert os.environ['ATEN_CPU_CAPABILITY'] == 'avx2'")
    bad = notebook(tmp_path / "02_bad.ipynb", "raise RuntimeError('boom')", "print('never')")
    out = tmp_path / "out"
    assert bench_lessons.main([str(ok), str(bad), "--out", str(out), "--emulate-avx2"]) == 1
    report = json.loads((out / "lesson-timings.json").read_text())
    first, second = report["notebooks"]
    assert first["status"] == "ok" and first["slowest"][0]["id"] == "cell-0"
    assert 0.4 <= first["slowest"][0]["seconds"] < 5
    assert second["status"].startswith("error") and "boom" in second["status"]
    assert report["machine"]["isa_cap"] and not report["machine"]["native_bf16"]
    md = (out / "lesson-timings.md").read_text()
    assert "| notebook | seconds |" in md and "01_ok.ipynb" in md
    assert bench_lessons.main([str(tmp_path / "missing.ipynb"), "--out", str(out)]) == 2


def test_a_notebook_over_its_limit_is_interrupted_and_what_ran_is_kept(tmp_path):
    slow = notebook(tmp_path / "03_slow.ipynb", "print('first')", "import time\ntime.sleep(60)",
                    "print('never')")
    out, executed = tmp_path / "out", tmp_path / "executed"
    assert bench_lessons.main([str(slow), "--out", str(out), "--limit", "3",
                               "--save-executed", str(executed)]) == 1
    report = json.loads((out / "lesson-timings.json").read_text())
    (r,) = report["notebooks"]
    assert r["status"] == "stopped at the 3 s limit (--limit)" and r["seconds"] < 30
    kept = executed / slow.parent.name   # one folder per notebook folder: 03_x of notebooks/ and
    cells = nbformat.read(kept / "03_slow.ipynb", 4).cells   # of solutions/ do not collide
    assert cells[0].outputs[0]["text"] == "first\n" and not cells[2].outputs
    text = (kept / "03_slow.txt").read_text()
    assert "--- [cell-0]\nfirst\n" in text and "KeyboardInterrupt" in text
