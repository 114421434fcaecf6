"""course_utils.store: the results store writes only in its folder."""
from __future__ import annotations

from pathlib import Path

import pytest

from course_utils import claims
from course_utils.config import config_for
from course_utils.terms import MiB


@pytest.fixture
def results_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path))
    return tmp_path


def test_store_writes_nothing_outside_its_folder(results_dir):
    claims.verdict("C10", where="03 §6", record=True)
    assert [p.name for p in Path(results_dir).iterdir()] == ["results.json"]
    assert config_for("smoke").batch_size > 0 and MiB == 2**20
