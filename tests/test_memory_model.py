"""The analytic peak against the measured one (issue 9: the old model was off by +19 % for
every-2 and -9 % for full at the cpu profile, and lessons plotted it as "estimate")."""
import pytest

from course_utils.config import config_for
from course_utils.measure import measure
from course_utils.memory_model import estimate, peak_walk


@pytest.mark.parametrize("precision,policy,batch", [
    ("fp32", "none", 8), ("fp32", "full", 8), ("fp32", "every-2", 8), ("fp32", "segments:2", 8),
    ("fp32", "selective", 8), ("fp32", "full", 16), ("bf16", "full", 4)])
def test_peak_estimate_within_5_percent_at_the_cpu_profile(precision, policy, batch):
    cfg = config_for("cpu", device="cpu", precision=precision, checkpoint=policy,
                     batch_size=batch)
    measured = measure(cfg, timed=False).peak_allocated
    assert estimate(cfg).peak_allocated == pytest.approx(measured, rel=0.05)


def test_the_peak_moves_with_the_policy():
    """Where the model puts the peak, as measured timelines of one step show it (a CPU, batch 8:
    at 0.12-0.15 of the backward pass without checkpointing, 0.8-0.9 with full, about 0.4 with
    every-2): early in backward without checkpointing (the last block), in the first unit's
    recompute with full checkpointing, in block 2's recompute with every-2 (after the plain
    block 3 freed its tensors), at the optimizer step for a tiny batch."""
    def where(**kw):
        walk = peak_walk(config_for("cpu", device="cpu", **kw))
        return max(walk, key=lambda m: m[1])[0]
    assert where(checkpoint="none", batch_size=8) == "backward of unit 3"
    assert where(checkpoint="full", batch_size=8) == "backward of unit 0"
    assert where(checkpoint="every-2", batch_size=8) == "backward of unit 2"
    assert where(checkpoint="none", batch_size=1, seq_len=8) == "optimizer step"
