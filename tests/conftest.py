"""Shared pytest setup: tests run at the `smoke` size profile unless told otherwise."""
import os

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
