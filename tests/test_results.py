"""course_utils.results: committed course-bench results, read from where the course is installed."""
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from course_utils import results
from course_utils.terms import MiB

ROOT = Path(__file__).resolve().parents[1]


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
    assert results.committed_memory_tools(tmp_path)["model"] == (   # today's 'h100' profile
        "the 'h100' model (6 layers, d_model 1536, 172M parameters, micro-batch 16, bf16)")
    # the same run's course-bench says what the profile was that day (its dimensions change)
    (tmp_path / "Some-GPU-2026-01-01").mkdir()
    (tmp_path / "Some-GPU-2026-01-01" / "bench.json").write_text(json.dumps(
        {"size": "h100", "rows": [{"config": {"n_layers": 12, "d_model": 1536, "n_heads": 16,
                                              "seq_len": 1024, "batch_size": 16}}]}))
    assert results.committed_memory_tools(tmp_path)["model"] == (
        "the 'h100' model (12 layers, d_model 1536, 342M parameters, micro-batch 16, bf16)")
    committed = results.committed_memory_tools()               # the run committed with the course
    assert committed is None or committed["reserved"] >= committed["peak_allocated"] > 0
    if committed is not None and committed["run"].endswith("H100-80GB-HBM3-2026-11-26"):
        assert committed["model"].startswith("the 'h100' model (12 layers")


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


def _row(label, prec, ckpt, t, r, lo, hi, emulated=False):
    return {"label": label, "config": {"precision": prec, "checkpoint": ckpt},
            "measured": {"step_time_s": t, "peak_allocated": 100 * MiB, "saved_total": 50 * MiB},
            "ratios": {"time_ratio": r, "time_ratio_low": lo, "time_ratio_high": hi},
            "time_verdict": "faster", "emulated": emulated}


#: An H100's course-bench rows as committed on 2026-11-26 (own medians 773.4, 93.1, 98.0, 113.6
#: and 109.3 ms; ratios to the first row are medians of per-round ratios).
H100_ROWS = [_row("fp32", "fp32", "none", 0.7734, 1.0, 1.0, 1.0),
             _row("bf16", "bf16", "none", 0.0931, 0.1202, 0.1198, 0.1237),
             _row("fp16", "fp16", "none", 0.0980, 0.1269, 0.1199, 0.1269),
             _row("bf16+full", "bf16", "full", 0.1136, 0.1470, 0.1459, 0.1472),
             _row("bf16+selective", "bf16", "selective", 0.1093, 0.1412, 0.1400, 0.1420)]


def _bench(path, gpu, rows, size="h100", stand_in="", precision="bf16"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "size": size, "recommendation": {"precision": precision},
        "hardware": {"device": "cuda", "name": gpu, "torch_version": "2.11", "stand_in": stand_in},
        "rows": rows}))


def test_committed_runs_give_each_run_a_title_and_a_readable_table(tmp_path):
    """Lesson 02 showed a GPU run as nine columns of bare ratios to fp32 (0.12, 0.15): each run
    now has a title line and its times against the recommended precision, told as verdicts."""
    _bench(tmp_path / "Some-GPU-2026-01-02" / "bench.json", "Some GPU", H100_ROWS[:4])
    [(title, table)] = results.committed_runs(tmp_path)
    assert title == "Some GPU; size 'h100', torch 2.11; run on 2026-01-02 (results/Some-GPU-2026-01-02):"
    assert list(table.index) == ["fp32", "bf16", "fp16", "bf16 + full checkpointing"]
    col = table["time vs bf16"]
    assert col["bf16"] == "1.00x (reference)" and col["fp16"] == "within noise"
    # full / bf16 = 0.1470 / 0.1202; its band [0.1459 / 0.1237, 0.1472 / 0.1198] excludes 1
    assert col["bf16 + full checkpointing"] == "1.22x slower"
    assert col["fp32"].endswith("x slower") and not any("0." in c for c in col)
    assert table.shape[1] + 1 <= 7 and "saved MiB" in table.columns
    assert results.committed_runs(tmp_path, devices=("cpu",)) == []


def test_a_committed_runs_printed_ratio_is_the_quotient_of_its_printed_times(tmp_path):
    """The H100 table printed 109.3 and 93.1 ms beside "1.18x slower" (1.174) and 773.4 beside
    "8.32x slower" (8.31): each row's own median beside a median of per-round ratios. A row's
    milliseconds are now the reference's times the row's ratio."""
    _bench(tmp_path / "NVIDIA-H100-80GB-HBM3-2026-11-26" / "bench.json", "NVIDIA H100", H100_ROWS)
    [(_, table)] = results.committed_runs(tmp_path)
    ref = table.loc["bf16", "step ms"]
    assert ref == 93.1
    for config, row in table.iterrows():
        cell = row["time vs bf16"]
        if cell.endswith(("slower", "faster")):
            printed = float(cell.split("x")[0])
            quotient = row["step ms"] / ref if cell.endswith("slower") else ref / row["step ms"]
            assert round(quotient, 2) == pytest.approx(printed, abs=0.011), (config, row.to_dict())
    assert table.loc["bf16 + selective checkpointing", "time vs bf16"] == "1.17x slower"
    assert table.loc["fp32", "step ms"] == pytest.approx(93.1 / 0.1202, abs=0.1)


def test_committed_runs_read_the_newest_run_of_each_class_in_both_layouts(tmp_path):
    """results/ holds the first layout (<run>/bench.json) and tools/gpu_results.sh's
    (<run>/<mode>/course-bench/bench.json, mode native or t4): lesson 02 shows the newest GPU run
    at its own profile and the newest T4 stand-in, each titled with its GPU and date."""
    _bench(tmp_path / "NVIDIA-H100-80GB-HBM3-2026-11-26" / "bench.json", "NVIDIA H100", H100_ROWS)
    t4_rows = [_row("fp16", "fp16", "none", 0.015, 1.0, 1.0, 1.0),
               _row("fp16+full", "fp16", "full", 0.026, 1.71, 1.49, 1.78),
               _row("bf16", "bf16", "none", 0.300, 20.0, None, None, emulated=True)]
    stand = "NVIDIA H200 standing in for a Tesla T4: its recipe, sizes and memory (14.75 GiB); not its speed"
    for day in ("2026-11-20", "2026-11-27-first-look"):
        _bench(tmp_path / f"NVIDIA-H200-{day}" / "t4" / "course-bench" / "bench.json",
               "NVIDIA H200 as a Tesla T4", t4_rows, size="t4", stand_in=stand, precision="fp16")
    _bench(tmp_path / "NVIDIA-H200-2026-11-27-first-look" / "native" / "course-bench" / "bench.json",
           "NVIDIA H200", H100_ROWS)
    runs = results.committed_runs(tmp_path)
    assert [t for t, _ in runs] == [
        "NVIDIA H200; size 'h100', torch 2.11; run on 2026-11-27 "
        "(results/NVIDIA-H200-2026-11-27-first-look):",
        f"{stand}; size 't4', torch 2.11; run on 2026-11-27 (results/NVIDIA-H200-2026-11-27-first-look):"]
    t4 = runs[1][1]
    assert t4.loc["fp16 + full checkpointing", "time vs fp16"] == "1.71x slower"
    # an emulated time: once, rounded, no verdict word and no milliseconds to four figures
    assert t4.loc["bf16", "time vs fp16"] == "emulated: about 20x"
    assert pd.isna(t4.loc["bf16", "step ms"])
    assert len(results.committed_runs(tmp_path, newest=False)) == 4
    assert {r.mode for r in results._bench_runs(tmp_path, None)} == {"native", "t4"}
    (tmp_path / "X-2026-01-01" / "colab" / "course-bench").mkdir(parents=True)
    (tmp_path / "X-2026-01-01" / "colab" / "course-bench" / "bench.json").write_text(
        (tmp_path / "NVIDIA-H100-80GB-HBM3-2026-11-26" / "bench.json").read_text())
    with pytest.raises(ValueError, match="colab"):
        results.committed_runs(tmp_path)


def test_the_committed_runs_of_the_course_read_and_agree(tmp_path):
    """The runs committed with the course: at most one per class, each titled with a date."""
    for title, table in results.committed_runs():
        assert re.search(r"run on \d{4}-\d{2}-\d{2}", title) and not table.empty
