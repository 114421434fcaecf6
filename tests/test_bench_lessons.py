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
