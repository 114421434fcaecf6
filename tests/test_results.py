"""course_utils.results: committed course-bench results, read from where the course is installed."""
import json
from pathlib import Path

import pandas as pd
import pytest

from course_utils import results

ROOT = Path(__file__).resolve().parents[1]


def test_committed_results_reads_course_bench_output(tmp_path):
    from course_utils.cli import main
    assert results.committed_results(tmp_path).empty
    assert list(results.committed_results(tmp_path).columns)[:4] == ["run", "device", "size",
                                                                    "config"]
    out = tmp_path / "Some-GPU-2026-01-01"
    assert main(["--size", "smoke", "--device", "cpu", "--precisions", "fp32",
                 "--steps", "1", "--out", str(out)]) == 0
    assert results.committed_results(tmp_path).empty          # a CPU run: not among the GPU runs
    df = results.committed_results(tmp_path, devices=("cpu",))
    assert list(df["run"]) == ["Some-GPU-2026-01-01"] and list(df["config"]) == ["fp32"]
    assert df["peak MiB"].iloc[0] > 0 and df["time x"].iloc[0] == pytest.approx(1.0)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "bench.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="broken"):
        results.committed_results(tmp_path, devices=None)
    assert isinstance(df, pd.DataFrame)


def test_results_are_found_beside_the_imported_course_not_from_the_working_folder(tmp_path,
                                                                                 monkeypatch):
    """On Colab the working folder is /content and the course is a clone inside it: the results
    committed with the course are the clone's."""
    course = Path(results.__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)                                    # Colab's /content
    assert results.find_results() == course / "results"
    stray = tmp_path / "work"
    (stray / "results").mkdir(parents=True)                        # not a copy of the course
    assert results.find_results(stray) == course / "results"
    monkeypatch.setattr(results, "_COURSE_ROOT", tmp_path / "site-packages")   # a wheel install
    assert results.find_results(stray) is None
    (stray / "course_utils").mkdir()
    assert results.find_results(stray / "notebooks") == stray / "results"
