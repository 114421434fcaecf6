"""course_utils.results: committed course-bench results, read from where the course is installed."""
import json
from pathlib import Path

import pandas as pd
import pytest

from course_utils import results
from course_utils.terms import MiB

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


TRANSCRIPT = """--- [setup]
device        : cuda (Some GPU 80GB)
torch         : 2.11.0+cu130

--- [cuda-memory-tools]
| Allocated memory      |   3997 MiB |  15524 MiB |  86928 MiB |  82931 MiB |
                                                        MiB
peak allocated in the step (max_memory_allocated)   15524.6
estimated peak (memory_model.estimate)              15580.5
reserved now (memory_reserved)                      16180.0
of which split blocks (fragmentation)                1082.7
used outside PyTorch's allocator: CUDA context,...    766.8
memory snapshot: /tmp/x/memory_snapshot.pickle (0.7 MiB).
--- [phase-timeline]
peak allocated in the step (max_memory_allocated)   1.0
"""


def test_committed_memory_tools_reads_lesson_04s_gpu_transcript(tmp_path):
    """Lesson 04's memory-tools cell, on a machine without a GPU, quotes the committed GPU run
    in one line: the four numbers of that cell's table, read from its section alone."""
    assert results.committed_memory_tools(tmp_path) is None
    folder = tmp_path / "lesson-timings-Some-GPU-2026-01-01" / "transcripts"
    folder.mkdir(parents=True)
    (folder / "04_scaling_out.txt").write_text(TRANSCRIPT.replace("--- [cuda-memory-tools]", "--- [other]"))
    assert results.committed_memory_tools(tmp_path) is None     # no table: nothing to quote
    (folder / "04_scaling_out.txt").write_text(TRANSCRIPT)
    got = results.committed_memory_tools(tmp_path)
    assert got == {"run": "lesson-timings-Some-GPU-2026-01-01", "device": "Some GPU 80GB",
                   "torch": "2.11.0+cu130", "model": None, "peak_allocated": 15524.6,
                   "reserved": 16180.0, "split_blocks": 1082.7, "outside_allocator": 766.8}
    # the setup names the size profile and the recipe: the line says which model it measured
    (folder / "04_scaling_out.txt").write_text(TRANSCRIPT.replace(
        "torch         : 2.11.0+cu130\n", "torch         : 2.11.0+cu130\nrecipe        : bf16\n"
        "\nsize profile 'h100'; the ranks train the 'cpu' model (4 layers) on cpu\n"))
    assert results.committed_memory_tools(tmp_path)["model"] == (
        "the 'h100' model (12 layers, d_model 1536, 342M parameters, micro-batch 16, bf16)")
    committed = results.committed_memory_tools()               # the run committed with the course
    assert committed is None or committed["reserved"] >= committed["peak_allocated"] > 0


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


def test_committed_runs_give_each_run_a_title_and_a_readable_table(tmp_path):
    """Lesson 02 showed a GPU run as nine columns of bare ratios to fp32 (0.12, 0.15): each run
    now has a title line and its times against the recommended precision, told as verdicts."""
    def row(label, prec, ckpt, t, r, lo, hi):
        return {"label": label, "config": {"precision": prec, "checkpoint": ckpt},
                "measured": {"step_time_s": t, "peak_allocated": 100 * MiB, "saved_total": 50 * MiB},
                "ratios": {"time_ratio": r, "time_ratio_low": lo, "time_ratio_high": hi},
                "time_verdict": "faster", "emulated": False}
    run = tmp_path / "Some-GPU-2026-01-02"
    run.mkdir()
    (run / "bench.json").write_text(json.dumps({
        "size": "h100", "recommendation": {"precision": "bf16"},
        "hardware": {"device": "cuda", "name": "Some GPU", "torch_version": "2.11"},
        "rows": [row("fp32", "fp32", "none", 0.7734, 1.0, 1.0, 1.0),
                 row("bf16", "bf16", "none", 0.0931, 0.1202, 0.1198, 0.1237),
                 row("fp16", "fp16", "none", 0.0980, 0.1269, 0.1199, 0.1269),
                 row("bf16+full", "bf16", "full", 0.1136, 0.1470, 0.1459, 0.1472)]}))
    [(title, table)] = results.committed_runs(tmp_path)
    assert title == "Some GPU, size 'h100', torch 2.11, 2026-01-02:"
    assert list(table.index) == ["fp32", "bf16", "fp16", "bf16 + full checkpointing"]
    col = table["time vs bf16"]
    assert col["bf16"] == "1.00x (reference)" and col["fp16"] == "within noise"
    # full / bf16 = 0.1470 / 0.1202; its band [0.1459 / 0.1237, 0.1472 / 0.1198] excludes 1
    assert col["bf16 + full checkpointing"] == "1.22x slower"
    assert col["fp32"].endswith("x slower") and not any("0." in c for c in col)
    assert table.shape[1] + 1 <= 7 and "saved MiB" in table.columns
    assert results.committed_runs(tmp_path, devices=("cpu",)) == []
