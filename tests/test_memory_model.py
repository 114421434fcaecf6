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
        cfg = config_for("cpu", device="cpu", **kw)
        walk = peak_walk(cfg)
        moment = max(walk, key=lambda m: m[1])[0]
        assert estimate(cfg).peak_moment == moment   # the estimate reports the walk's moment
        return moment
    assert where(checkpoint="none", batch_size=8) == "backward of block 3"
    assert where(checkpoint="full", batch_size=8) == "backward of block 0"
    assert where(checkpoint="every-2", batch_size=8) == "backward of block 2"
    assert where(checkpoint="segments:2", batch_size=8).startswith("backward of blocks ")
    assert where(checkpoint="none", batch_size=1, seq_len=8) == "optimizer step"


def test_accumulation_keeps_every_grad_buffer_alive_in_later_micro_batches():
    cfg = config_for("cpu", device="cpu", checkpoint="full", batch_size=4, grad_accum_steps=2)
    measured = measure(cfg, timed=False).peak_allocated
    assert estimate(cfg).peak_allocated == pytest.approx(measured, rel=0.05)
    assert estimate(cfg).peak_allocated > estimate(cfg.replace(grad_accum_steps=1)).peak_allocated


def test_adamw_temporaries_cpu_default_and_cuda_foreach():
    """The optimizer step's temporaries: PyTorch's default AdamW on a CPU (single-tensor) holds
    about two copies of the largest parameter tensor; the foreach implementation, the default on
    CUDA, about one copy of every parameter (4 N bytes). Measured here with foreach=True."""
    import torch

    from course_utils.memory_model import largest_parameter_tensor, parameter_count
    from course_utils.memory_timeline import peak_bytes
    from course_utils.models import build_model

    cfg = config_for("cpu", device="cpu")
    for foreach, expected in ((False, 2 * 4 * largest_parameter_tensor(cfg)),
                              (True, 4 * parameter_count(cfg))):
        model = build_model(cfg)
        opt = torch.optim.AdamW(model.parameters(), foreach=foreach)
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt.step()  # the state exists before the measured step
        assert peak_bytes(opt.step, "cpu") == pytest.approx(expected, rel=0.1), foreach
    walk = dict(peak_walk(cfg.replace(device="cuda")))
    assert walk["optimizer step"] == 8 * parameter_count(cfg)  # gradients + the foreach copy


def test_the_estimate_says_where_its_peak_falls():
    """The peak's moment and the parts alive then are data: the parts sum to the peak, the
    moment is the walk's largest, and at 1B-70B with one sequence per micro-batch it is the
    optimizer step (activations differ 9x between recipes, the peaks not at all)."""
    from course_utils.memory_model import PEAK_PARTS, peak_parts, scale_table
    for policy in ("none", "full", "selective", "segments:2"):
        cfg = config_for("cpu", precision="bf16", checkpoint=policy)
        e = estimate(cfg)
        assert set(e.peak_components) == set(PEAK_PARTS)
        assert abs(sum(e.peak_components.values()) - e.peak_allocated) <= len(PEAK_PARTS)
        moments = {m: sum(p.values()) for m, p in peak_parts(cfg)}
        assert e.peak_moment == max(moments, key=moments.get) and e.peak_at.endswith(e.peak_moment)
    t = scale_table()
    assert (t["peak at"] == "optimizer step").all()
    assert t.groupby("model")["peak GiB"].nunique().eq(1).all()
    assert len(t.columns) <= 7
    detail = t.attrs["detail"]
    parts = detail[[f"at peak: {p}" for p in PEAK_PARTS]].sum(axis=1)
    assert ((parts - detail["peak GiB"]).abs() < 1e-6).all()  # the chart's bars end at the peak
