"""course-bench (course_utils.cli): the ladder at the smoke size written as JSON with measured and
estimated fields, bad input and refused configurations rejected before anything runs, and one
guard check per configuration."""
import json
import subprocess
import sys

import pytest
import torch
from helpers import fake_machine

import course_utils.measure  # noqa: F401 - the module (course_utils.measure is the function)
from course_utils import guard
from course_utils.cli import main as bench
from course_utils.terms import GiB, MiB

measure_mod = sys.modules["course_utils.measure"]


def test_course_bench_checks_each_configuration_once(monkeypatch, capsys):
    from course_utils.cli import main

    checked = []
    real = guard.check_feasible

    def counting(config, hw=None, force=False):
        checked.append(config.label)
        return real(config, hw, force)
    monkeypatch.setattr(measure_mod, "check_feasible", counting)
    assert main(["--size", "smoke", "--steps", "1", "--precisions", "fp32", "--policies",
                 "none,full"]) == 0
    assert sorted(checked) == ["fp32", "fp32+full"]


def test_course_bench_smoke_writes_json_with_measured_and_estimated(tmp_path):
    out = tmp_path / "bench"
    r = subprocess.run([sys.executable, "-m", "course_utils.cli", "--size", "smoke",
                        "--device", "cpu", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    data = json.loads((out / "bench.json").read_text())
    rows = {row["label"]: row for row in data["rows"]}
    assert rows and list(rows)[0] == "fp32"
    full = next(label for label in rows if label.endswith("+full"))
    for row in rows.values():
        for field in ("activations", "peak_allocated", "parameters"):
            assert row["measured"][field] > 0 and row["estimated"][field] > 0
        assert row["measured"]["step_time_s"] > 0
        # at smoke size no time comparison is decided (fixed per-step overheads dominate)
        assert row["time_verdict"] in ("reference", "too small to time", "emulated")
    plain = next(label for label in rows if rows[label]["config"]["checkpoint"] == "none"
                 and rows[label]["config"]["precision"] == rows[full]["config"]["precision"])
    assert rows[full]["measured"]["activations"] < rows[plain]["measured"]["activations"]
    assert (out / "bench.png").stat().st_size > 10_000
    from course_utils.experiments import plain_label
    assert "est saved MiB" in r.stdout and plain_label(full) in r.stdout


def test_course_bench_refuses_bad_input_before_measuring(capsys, tmp_path, monkeypatch):
    from course_utils.cli import main
    monkeypatch.setattr(torch.cpu, "get_capabilities",
                        lambda: {"cpu_name": "AVX2 CPU", "avx2": True}, raising=False)
    for argv, words in (
            (["--size", "cpu", "--device", "cpu", "--precisions", "fp16"], "emulated"),
            (["--size", "smoke", "--policies", "every-7"], "does not fit"),
            (["--size", "smoke", "--device", "cuda:3"], "cuda"),
            (["--size", "smoke", "--out", str(tmp_path / "no" / "such")], "does not exist"),
            (["--size", "smoke", "--batch-size", "100000000"], "estimated peak")):
        assert main(argv) == 2, argv
        assert words in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["--size", "smoke", "--out", str(tmp_path / "file")]) == 2
    assert "existing file" in capsys.readouterr().err
    for bad in (["--precisions", "fp8"], ["--batch-size", "0"], ["--seq-len", "0"],
                ["--steps", "-1"]):
        with pytest.raises(SystemExit):
            main(bad)
        err = capsys.readouterr().err
        assert "expected" in err or "unknown" in err, err


def test_course_bench_refuses_under_the_cgroup_limit(tmp_path, monkeypatch, capsys):
    fake_machine(tmp_path, monkeypatch, ram=64 * GiB, limit=300 * MiB, usage=280 * MiB)
    assert bench(["--size", "smoke", "--device", "cpu", "--batch-size", "64"]) == 2
    assert "container's memory limit" in capsys.readouterr().err
