"""Shared pytest setup: tests run at the `smoke` size profile unless told otherwise."""
import os
from pathlib import Path

os.environ.setdefault("COURSE_SIZE", "smoke")

# The results store (course_utils.store) of a test run: a fresh temporary folder, inherited by
# the notebook kernels nbval starts, never the learner's ~/.cache/amp-course.
if "COURSE_RESULTS_DIR" not in os.environ:
    import tempfile

    os.environ["COURSE_RESULTS_DIR"] = tempfile.mkdtemp(prefix="amp-course-results-")


# Fixtures several test modules share (helpers of the same kind: tests/helpers.py).
import pytest  # noqa: E402 - after the environment above, which the course reads on import
import torch  # noqa: E402

from course_utils import search  # noqa: E402
from course_utils.config import config_for  # noqa: E402
from course_utils.models import build_model  # noqa: E402


@pytest.fixture(scope="module")
def cfg():
    """The `smoke` profile on the CPU."""
    return config_for("smoke", device="cpu")


@pytest.fixture(scope="module")
def block(cfg):
    """The first block of a seeded `smoke` model."""
    torch.manual_seed(0)
    return build_model(cfg).layers[0]


@pytest.fixture(scope="module")
def fp32_search():
    """fp32's largest batch under the peak fp32 itself measured at batch 3: ``(budget, search)``."""
    from helpers import peak_at
    cfg = config_for("smoke", device="cpu", precision="fp32")
    budget = peak_at(cfg, 3)
    return budget, search.largest_batch(cfg, budget)


# ------------------------------------------------------------------ what a lesson shows
# Issue 24: every table a notebook displays has at most 6 columns, and no emulated timing wears
# a verdict word: checked on the outputs nbval collects as it runs each notebook cell (the
# notebooks run once, here, at the smoke size). The rules: tests/nbcells.py.
from nbcells import shown_problems  # noqa: E402

_KO = Path(__file__).resolve().parents[1] / "ko"   # the Korean edition (issue 28)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    outputs = getattr(item, "test_outputs", None)  # an nbval cell, once it ran
    if outputs:
        korean = _KO in Path(item.path).resolve().parents
        problems = shown_problems(outputs, korean=korean)
        if problems:
            pytest.fail("; ".join(problems), pytrace=False)
    return result
