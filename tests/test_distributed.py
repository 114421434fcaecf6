"""course_utils.distributed, lesson 04's plumbing: the torchrun launcher's errors and time limit, the
per-rank byte counter, one core rule under a CPU quota, and lesson 04's ZeRO script measured
with two gloo ranks against the estimate.

The launches take most of the time here (each starts torchrun's agent and its ranks, each
importing torch: about 5-10 s on a 2-core machine); the other tests take well under a second.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from nbcells import cell

from course_utils import distributed, hardware, plots
from course_utils.config import config_for
from course_utils.hardware import usable_cores
from course_utils.i18n import tr
from course_utils.memory_model import estimate, sharded_estimate

ROOT = Path(__file__).resolve().parents[1]
LESSON = ROOT / "notebooks" / "04_scaling_out.ipynb"


# --------------------------------------------------------------------------- the arithmetic


# --------------------------------------------------------------------------- in-process helpers

def test_state_bytes_of_one_process():
    cfg = config_for("smoke", device="cpu")
    from course_utils.models import build_model
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters())
    before = distributed.state_bytes(model, opt)
    assert before == {"parameters": estimate(cfg).parameters, "gradients": 0, "optimizer_state": 0}
    x = torch.randint(0, 256, (2, 8))
    model(x, x)[1].backward()
    opt.step()
    after = distributed.state_bytes(model, opt)
    e = estimate(cfg)
    assert after == {"parameters": e.parameters, "gradients": e.gradients,
                     "optimizer_state": e.optimizer_state}


def test_rank_report_writes_one_file_per_rank(tmp_path, monkeypatch):
    monkeypatch.delenv(distributed.REPORT_ENV, raising=False)
    assert distributed.rank_report({"a": 1}) is None          # run by hand: nothing written
    monkeypatch.setenv(distributed.REPORT_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    path = distributed.rank_report({"a": 1})
    assert path == tmp_path / "rank3.json" and json.loads(path.read_text()) == {"a": 1}
    with pytest.raises(TypeError):
        distributed.rank_report([1, 2])
    with pytest.raises(TypeError):
        distributed.rank_report({"t": torch.ones(1)})


def answer(x):
    return nullcontext, x + 1  # noqa: F821 - resolved by write_module's header in the module


def test_write_module_ships_a_function(tmp_path):
    import importlib.util
    path = distributed.write_module(tmp_path / "shipped.py", answer)
    spec = importlib.util.spec_from_file_location("shipped", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ctx, value = module.answer(41)
    assert value == 42 and ctx.__name__ == "nullcontext"
    with pytest.raises(TypeError):
        distributed.write_module(tmp_path / "x.py", 42)


# --------------------------------------------------------------------------- the launcher's errors

def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("nproc", [0, -1, "2", 2.0, True])
def test_launch_rejects_a_bad_rank_count(tmp_path, nproc):
    script = write(tmp_path, "ok.py", "")
    with pytest.raises(ValueError, match="positive integer"):
        distributed.launch(script, nproc)


def test_launch_refuses_more_ranks_than_the_machine_runs(tmp_path):
    script = write(tmp_path, "ok.py", "")
    cores = usable_cores()
    with pytest.raises(ValueError, match=f"lets this process use {cores}"):
        distributed.launch(script, cores + 1, backend="gloo")
    if torch.cuda.device_count() < 2:
        with pytest.raises(ValueError, match="GPUs"):
            distributed.launch(script, 2, backend="nccl")
    with pytest.raises(ValueError, match="unknown backend"):
        distributed.launch(script, 1, backend="mpi")


def test_launch_needs_the_script(tmp_path):
    with pytest.raises(FileNotFoundError, match="write it first"):
        distributed.launch(tmp_path / "missing.py", 1)


def test_a_failing_rank_raises_with_its_error_first(tmp_path):
    script = write(tmp_path, "fails.py",
                   "import os\nif os.environ['RANK'] == '0':\n    raise ValueError('boom on rank 0')\n")
    with pytest.raises(distributed.LaunchError) as info:
        distributed.launch(script, 1, timeout=120)
    first = str(info.value).splitlines()[0]
    assert "exited with status" in first and "ValueError: boom on rank 0" in first, first
    assert "Traceback" in info.value.stderr_tail and info.value.returncode != 0


def test_a_rank_that_hangs_is_stopped_at_the_time_limit(tmp_path):
    pid_file = tmp_path / "rank.pid"
    script = write(tmp_path, "hangs.py",
                   f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
                   "time.sleep(600)\n")
    # torchrun's agent imports torch before it starts the rank: on a busy machine that alone can
    # take longer than the first limit, so a second, longer one follows if the rank never started
    for limit in (12, 45):
        started = time.monotonic()
        with pytest.raises(distributed.LaunchError, match=f"did not finish within {limit} s"):
            distributed.launch(script, 1, timeout=limit)
        assert time.monotonic() - started < limit + 30, "stopping torchrun took too long"
        if pid_file.exists():
            break
    else:
        pytest.fail("the rank never started, even with a 45 s limit")
    pid = int(pid_file.read_text())
    for _ in range(50):                                   # the rank runs in its own session
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"rank process {pid} survived the time-out")


def test_a_rank_killed_by_a_signal_is_named_on_the_first_line(tmp_path):
    # what a C++ abort looks like (gloo's "terminate called without an active exception"):
    # no Python error line, only torchrun's record of the rank's exit code
    script = write(tmp_path, "aborts.py", "import os, sys\n"
                   "print('terminate called without an active exception', file=sys.stderr)\n"
                   "sys.stderr.flush()\nos.abort()\n")
    with pytest.raises(distributed.LaunchError) as info:
        distributed.launch(script, 1, timeout=120)
    first = str(info.value).splitlines()[0]
    assert "rank 0 died of SIGABRT: terminate called without an active exception" in first, first


def test_the_last_error_reads_torchruns_record_and_the_ranks_lines():
    stderr = ("[rank1]: Traceback (most recent call last):\n"
              "[rank1]: RuntimeError: Connection closed by peer\n"
              "E1124 api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 7) of binary: python\n"
              "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")
    assert distributed._last_error(stderr) == "RuntimeError: Connection closed by peer"
    killed = "E1124 api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 7) of binary: python\n"
    assert distributed._last_error(killed) == "rank 0 died of SIGKILL"


def test_a_korean_learner_reads_the_launchers_errors_in_korean(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_LANG", "ko")
    killed = "E1124 api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 7) of binary: python\n"
    assert distributed._last_error(killed) == "랭크 0이(가) SIGKILL 신호로 종료됨"
    with pytest.raises(FileNotFoundError) as info:
        distributed.launch(tmp_path / "nope.py", 1, backend="gloo")
    assert str(info.value) == (f"{(tmp_path / 'nope.py').resolve()}에 스크립트가 없습니다. 먼저 "
                               "작성하세요(예: %%writefile로).")


def test_ranks_end_without_interpreter_teardown(tmp_path):
    # the rank runner ends each rank with os._exit once the script is done: nothing runs at
    # interpreter teardown (where gloo's threads, still alive, could abort the rank)
    script = write(tmp_path, "atexit_probe.py",
                   "import atexit, sys\nfrom course_utils.distributed import rank_report\n"
                   "atexit.register(print, 'TEARDOWN RAN')\nprint('[rank 0] done')\n"
                   "rank_report({'argv': sys.argv[1:], 'main': __name__})\n")
    run = distributed.launch(script, 1, ["--flag", 3], timeout=120)
    assert run.output == "[rank 0] done" and "TEARDOWN" not in run.stdout
    assert run.reports == [{"argv": ["--flag", "3"], "main": "__main__"}]
    assert run.command_line.endswith(f"--nproc-per-node=1 {script} --flag 3")
    failing = write(tmp_path, "exits.py", "import sys\nsys.exit(3)\n")
    with pytest.raises(distributed.LaunchError, match="exited with status"):
        distributed.launch(failing, 1, timeout=120)


def test_threads_per_rank_share_out_the_callers_budget(monkeypatch):
    cores = usable_cores()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert distributed.threads_per_rank(2) == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert distributed.threads_per_rank(2) == max(1, cores // 2)
    monkeypatch.setenv("OMP_NUM_THREADS", str(4 * cores))  # never more than the cores
    assert distributed.threads_per_rank(1) == cores


def test_gloo_ranks_and_torch_threads_follow_one_core_rule_under_a_cpu_quota(tmp_path, monkeypatch):
    """A container limited to one CPU's worth (cgroup v2 ``cpu.max``) on a machine with more
    cores: torch's threads and the gloo ranks both see one core."""
    quota = tmp_path / "cpu.max"
    quota.write_text("100000 100000\n")
    monkeypatch.setattr(hardware, "CPU_QUOTA", str(quota))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert hardware.usable_cores() == 1
    assert distributed.max_world_size("gloo") == 1 and distributed.threads_per_rank(1) == 1
    with pytest.raises(ValueError, match="lets this process use 1"):
        distributed.launch(write(tmp_path, "ok.py", ""), 2, backend="gloo")
    quota.write_text("max 100000\n")  # no quota: the affinity and the physical cores decide
    assert distributed.max_world_size("gloo") == hardware.usable_cores() >= 1


def test_a_rank_without_a_report_is_an_error(tmp_path):
    script = write(tmp_path, "silent.py", "print('[rank 0] hello')\n")
    with pytest.raises(distributed.LaunchError, match="rank 0 wrote no report") as info:
        distributed.launch(script, 1, timeout=120)
    assert info.value.stdout.strip() == "[rank 0] hello" and info.value.returncode == 0


# --------------------------------------------------------------------------- measured under torchrun

def lesson_script(cell_id: str) -> str:
    """The body of a %%writefile cell of lesson 04 (the script the learner reads)."""
    first, _, body = cell(LESSON, cell_id).source.partition("\n")
    assert first.startswith("%%writefile"), f"cell {cell_id} is no longer a %%writefile cell"
    return body


@pytest.mark.skipif(usable_cores() < 2, reason="two gloo ranks need two CPU cores")
def test_zero_stages_measured_with_two_gloo_ranks_match_the_estimate(tmp_path):
    script = write(tmp_path, "shard_memory.py", lesson_script("fsdp-script"))
    run = distributed.launch(script, 2, ["--size", "smoke", "--backend", "gloo"], backend="gloo",
                             timeout=300)
    assert run.command_line.startswith("torchrun --standalone --nproc-per-node=2 ")
    assert run.threads_per_rank == distributed.threads_per_rank(2)
    assert [r["rank"] for r in run.reports] == [0, 1]
    assert all(r["world_size"] == 2 for r in run.reports)
    cfg = config_for("smoke", device="cpu")
    for report in run.reports:
        for stage in range(4):
            measured = report["stages"][str(stage)]
            est = sharded_estimate(cfg, 2, stage)
            for part in ("parameters", "gradients", "optimizer_state"):
                ratio = measured[part] / getattr(est, part)
                assert abs(ratio - 1) < 0.05, (report["rank"], stage, part, measured[part],
                                               getattr(est, part))
        # FSDP2 shards the smoke model's tensors evenly: exactly the estimate
        fsdp = report["stages"]["3"]
        est3 = sharded_estimate(cfg, 2, 3)
        assert (fsdp["parameters"], fsdp["gradients"], fsdp["optimizer_state"]) == (
            est3.parameters, est3.gradients, est3.optimizer_state)
    # FSDP2's MixedPrecisionPolicy casts the block's input (module level, not autocast's per op)
    assert all(r["block_input"] == {"0": "float32", "1": "float32", "2": "float32", "3": "bfloat16"}
               for r in run.reports)
    # sharding really divides: stage 3 holds half of stage 0 on every rank
    for report in run.reports:
        s0 = sum(report["stages"]["0"].values())
        s3 = sum(report["stages"]["3"].values())
        assert abs(s3 / s0 - 0.5) < 0.001
    table = distributed.sharding_table(run.reports, cfg)
    assert len(table) == 8 and (table["worst part / estimate"] - 1).abs().max() < 0.05
    fig = plots.sharding_chart(table, cfg)
    assert len(fig.axes[0].lines) == 4 and len(fig.axes[0].collections) == 4   # 4 stages: line + dots


# --------------------------------------------------------------------------- the lesson's telling

def run_lesson_cell(cell_id: str, namespace: dict):
    """Run one code cell of lesson 04 in ``namespace``; returns (printed text, last value)."""
    import ast
    import contextlib
    import io
    tree = ast.parse(cell(LESSON, cell_id).source)
    last = tree.body.pop() if isinstance(tree.body[-1], ast.Expr) else None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(tree, cell_id, "exec"), namespace)
        value = eval(compile(ast.Expression(last.value), cell_id, "eval"), namespace) if last else None
    return out.getvalue(), value


@pytest.mark.skipif(torch.cuda.is_available(), reason="the cell's CPU branch")
def test_the_gpu_only_memory_cell_says_so_in_one_line_on_a_cpu():
    """Audit C, finding 8: no 9-column table of committed runs; one line, the committed run's
    numbers in MiB, no long floats."""
    import re

    from course_utils.hardware import detect
    from course_utils.results import committed_memory_tools
    printed, value = run_lesson_cell("cuda-memory-tools", {
        "torch": torch, "hw": detect("cpu"), "committed_memory_tools": committed_memory_tools, "tr": tr})
    assert value is None and len(printed.strip().splitlines()) == 1, printed
    assert printed.startswith("needs a CUDA GPU (this is cpu")
    if committed_memory_tools() is not None:
        assert "MiB reserved" in printed and "outside PyTorch's allocator" in printed
    assert not re.search(r"\d\.\d{3,}", printed), "long floats"


def test_the_fp8_tables_print_short_numbers_and_say_what_was_flushed():
    """Audit C, findings 7 and 17, and issue 26 item 4: powers of two and plain maxima in the
    formats table (E8M0 and E2M1 included), two significant figures in the error table (at most
    6 columns), the flushed shares printed from the numbers, the outlier line from its numbers."""
    import pandas as pd

    from course_utils import formats
    from course_utils.config import config_for
    from course_utils.data import get_batch
    from course_utils.models import build_model
    ns = {"torch": torch, "pd": pd, "formats": formats, "SMALL": "smoke", "config_for": config_for,
          "build_model": build_model, "get_batch": get_batch, "tr": tr}
    _, table = run_lesson_cell("fp8-formats", ns)
    assert list(table.index) == ["bf16", "fp8 e4m3", "fp8 e5m2", "e8m0", "fp4 e2m1"]
    assert list(table["max"]) == ["3.4e+38", "448", "57,344", "1.7e+38", "6"]
    assert list(table["smallest normal"]) == ["2^-126", "2^-6", "2^-14", "2^-127", "2^0"]
    printed, errors = run_lesson_cell("fp8-scaling", ns)
    assert list(errors.index) == list(formats.RECIPES) and errors.shape[1] <= 6
    assert all(len(v) <= 6 for v in errors.drop(columns="bits per value").stack())
    flushed = ns["fp8_table"]["flushed to 0 (%)"]
    assert flushed[("e4m3 unscaled", "gradient")] > 90, "small gradients flush without a scale"
    for (recipe, tensor), v in flushed[flushed >= 0.1].items():
        assert f"{tensor} {v:.3g}%" in printed.split(f"{recipe}: ")[1].split(";")[0], (recipe, tensor)
    assert f"(largest {flushed[flushed < 0.1].max():.2g}%)" in printed
    printed, _ = run_lesson_cell("fp8-outlier", ns)
    for r, v in ns["lost"].items():
        assert f"{r} {v:.2g}%" in printed
    assert ns["lost"]["e4m3 rowwise"] <= 100 * ns["spiked"].shape[-1] / ns["spiked"].numel() + 1e-9


def test_the_lesson_says_a_skipped_measurement_once():
    """Audit C, finding 18: C19's line points at the reason printed above instead of repeating
    it; the ranks not run print as a number, not a list."""
    from course_utils.hardware import detect
    printed, _ = run_lesson_cell("c19-verdict", {"hw": detect("cpu"), "fp8_time": None,
                                                 "fp8_why_not": "no CUDA GPU here", "tr": tr})
    assert printed.strip() == "C19: not measured here (see above)"
    assert "ranks differ by a few percent" not in cell(LESSON, "fsdp-read").source
    assert "stage 2 they still hold every gradient" in cell(LESSON, "fsdp-table-md").source


def test_the_lesson_launches_torchrun_twice():
    """Issue 24 item 5: each torchrun launch costs about 15 s (mostly processes importing torch);
    the lesson launches DDP once and the ZeRO script once, at two ranks (the one-rank numbers are
    stage 0's row and the arithmetic table's)."""
    from nbcells import code
    assert code(LESSON).count("distributed.launch(") == 2
