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
