"""Shared pytest setup: tests run at the `smoke` size profile unless told otherwise."""
import os

os.environ.setdefault("COURSE_SIZE", "smoke")

# The results store (course_utils.store) of a test run: a fresh temporary folder, inherited by
# the notebook kernels nbval starts, never the learner's ~/.cache/amp-course.
if "COURSE_RESULTS_DIR" not in os.environ:
    import tempfile

    os.environ["COURSE_RESULTS_DIR"] = tempfile.mkdtemp(prefix="amp-course-results-")
