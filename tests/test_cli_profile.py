"""course-profile (course_utils.cli_profile): the card printed and written as JSON, for the course's
GPT and other models."""
from __future__ import annotations

import json
import math

import pytest

from course_utils.cli_profile import main as cli_main


def test_cli_prints_the_card_and_writes_json(tmp_path, capsys):
    out = tmp_path / "card.json"
    status = cli_main(["--course-gpt", "--size", "smoke", "--budget", "16MiB", "--device", "cpu",
                       "--policies", "none,full", "--precisions", "fp32", "--time-budget", "0.05",
                       "--target-batch", "8", "--out", str(out)])
    text = capsys.readouterr().out
    assert status == 0
    assert "Recommendation for course GPT" in text and "recipe" in text
    data = json.loads(out.read_text())
    assert data["card"]["effective_batch"] >= 8
    assert {r["checkpoint"] for r in data["profile"]} == {"none", "full"}
    with pytest.raises(SystemExit):
        cli_main(["--budget", "1GiB"])  # no model
    with pytest.raises(SystemExit):
        cli_main(["--course-gpt", "--cnn"])
    assert math.isfinite(data["extrapolation"]["fp32"]["per_sample_bytes"]["none"])


@pytest.mark.parametrize("model", [["--cnn"], ["--hf-config", "gpt2"], ["--hf-config", "llama"]])
def test_cli_on_the_other_models(model, capsys):
    if "--hf-config" in model:
        pytest.importorskip("transformers")  # the [hf] extra: make test installs it
    status = cli_main([*model, "--size", "smoke", "--budget", "64MiB", "--device", "cpu",
                       "--policies", "none,full", "--precisions", "fp32", "--time-budget", "0.05",
                       "--batch-size", "2", "--no-check"])
    text = capsys.readouterr().out
    assert status == 0 and "recipe      : fp32 + no checkpointing" in text


SMALL = ["--course-gpt", "--size", "smoke", "--device", "cpu", "--policies", "none,full",
         "--precisions", "fp32", "--time-budget", "0.05"]


def test_on_a_cpu_without_a_budget_the_profile_is_printed_into_a_folder(tmp_path, capsys):
    """Issue 27: on a laptop, `course-profile` exited at once with no result; --out DIR raised
    IsADirectoryError after the whole profile ran."""
    assert cli_main([*SMALL, "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "fp32 + full checkpointing" in text  # the profile's table
    assert "No recommendation card" in text and "--for t4|a100-40gb|a100-80gb|h100" in text
    written = tmp_path / "course-profile-course-GPT-2L-64d.json"
    data = json.loads(written.read_text())
    assert data["card"] is None and {r["checkpoint"] for r in data["profile"]} == {"none", "full"}


def test_for_a_named_gpu_its_memory_is_the_budget(tmp_path, capsys, monkeypatch):
    from course_utils import card, cli_profile, stand_in
    checks = []
    real = card.profile_and_recommend
    monkeypatch.setattr(cli_profile, "profile_and_recommend",
                        lambda *a, **kw: checks.append(kw["check"]) or real(*a, **kw))
    assert cli_profile.GPUS["t4"][1] == stand_in.STAND_INS["t4"].memory_bytes  # one T4 figure
    out = tmp_path / "new" / ""  # a folder to make, said with a trailing separator
    assert cli_main([*SMALL, "--for", "t4", "--out", str(out) + "/"]) == 0
    text = capsys.readouterr().out
    assert "planning for a Tesla T4: budget 14.75 GiB, the memory CUDA reports on one" in text
    assert "budget      : 14.75 GiB (a Tesla T4's memory as CUDA reports it: --for t4)" in text
    assert checks == [False]  # no check step: it would run a T4-sized batch on this CPU
    data = json.loads((tmp_path / "new" / "course-profile-course-GPT-2L-64d.json").read_text())
    assert data["card"]["budget_bytes"] == stand_in.STAND_INS["t4"].memory_bytes


@pytest.mark.parametrize("out, said", [
    ("missing/card.json", "does not exist"),
    ("a_file/card.json", "is a file, not a folder"),
    ("taken/", "is a folder: give a file name"),
    ("/proc/course-profile-card.json", "cannot write into the folder '/proc'"),
])
def test_a_bad_out_path_is_refused_before_anything_runs(out, said, tmp_path, monkeypatch, capsys):
    from course_utils import cli_profile

    def never(*args, **kwargs):
        raise AssertionError("the profile ran before --out was checked")
    monkeypatch.setattr(cli_profile, "profile_and_recommend", never)
    monkeypatch.setattr(cli_profile, "profile", never)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "taken" / "course-profile-course-GPT-2L-64d.json").mkdir(parents=True)
    with pytest.raises(SystemExit) as stop:
        cli_main([*SMALL, "--out", out])
    assert stop.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize("argv, said", [
    (["--for", "v100"], "invalid choice: 'v100'"),
    (["--for", "t4", "--budget", "2GiB"], "not allowed with argument"),
    (["--time-budget", "nan"], "expected a positive number of seconds"),
    (["--time-budget", "0"], "expected a positive number of seconds"),
    (["--budget=-2GiB"], "expected a size"),
    (["--batch-size", "two"], "expected a positive integer"),
])
def test_bad_values_are_refused_in_words(argv, said, capsys):
    with pytest.raises(SystemExit) as stop:
        cli_main([*SMALL, *argv])
    assert stop.value.code == 2 and said in capsys.readouterr().err
