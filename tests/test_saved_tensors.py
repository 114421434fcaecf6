"""The saved-tensor meter (course_utils.saved_tensors) on every checkpoint policy, selective
checkpointing included, against the analytic estimate (an independent count).

Selective checkpointing (SAC) keeps its tensors in its own cache, out of saved-tensor hooks'
sight. The meter once read them from the policy's ``ctx.op_output``, which torch 2.11 (Colab's)
does not pass: there it silently reported full checkpointing's bytes for `selective`. These tests
run in the support matrix (make test-matrix) on Colab's torch, the declared floor and the newest.
"""
import contextlib

import pytest
import torch

import course_utils.checkpointing as ck
import course_utils.saved_tensors as meter_module
from course_utils.config import config_for
from course_utils.data import get_batch
from course_utils.experiments import compare
from course_utils.measure import STRICT_ENV, EstimateGap, measure
from course_utils.memory_model import estimate
from course_utils.models import build_model
from course_utils.saved_tensors import measure_saved

SMOKE = config_for("smoke", device="cpu")
SAVED = ("activations", "autocast_weight_copies", "logits")


def _meter(cfg):
    torch.manual_seed(0)
    model = build_model(cfg)
    x, y = get_batch(cfg.batch_size, cfg.seq_len)
    return measure_saved(model, x, y, cfg.precision)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_selective_saved_bytes_equal_the_estimate_and_lie_between_full_and_none(precision):
    totals = {}
    for policy in ("none", "full", "selective"):
        cfg = SMOKE.replace(precision=precision, checkpoint=policy)
        meter = _meter(cfg)
        assert meter.unmeasured is None
        totals[policy] = meter.totals()
        est = estimate(cfg)
        for field in SAVED:
            assert totals[policy][field] == getattr(est, field), (policy, field)
    act = {p: t["activations"] for p, t in totals.items()}
    assert act["full"] < act["selective"] < act["none"]


def test_the_meter_reads_what_sac_kept_not_what_the_hooks_saw():
    # The hooks alone see only the checkpointed blocks' inputs (full checkpointing's bytes);
    # the cache adds the kept matmul and attention outputs.
    cfg = SMOKE.replace(checkpoint="selective")
    torch.manual_seed(0)
    model = build_model(cfg)
    x, y = get_batch(cfg.batch_size, cfg.seq_len)
    meter = measure_saved(model, x, y)
    from_cache = [r for r in meter.records if r["grad_fn"] == "SAC cache"]
    assert from_cache and all(r["nbytes"] > 0 for r in from_cache)
    contexts = ck.selective_contexts(model)
    assert len(contexts) == cfg.n_layers
    assert all(c.recording is None for c in contexts)  # recording ends with the meter


def test_an_unreadable_sac_cache_gives_none_with_the_reason_never_a_number(monkeypatch):
    # A torch whose selective checkpointing keeps its tensors elsewhere: the forward context
    # has no cache the meter can read. The measurement must say "not measured here".
    monkeypatch.setattr(ck, "create_selective_checkpoint_contexts",
                        lambda policy: (contextlib.nullcontext(), contextlib.nullcontext()))
    meter = _meter(SMOKE.replace(checkpoint="selective"))
    assert meter.unmeasured and torch.__version__ in meter.unmeasured
    m = measure(SMOKE.replace(checkpoint="selective"), timed=False)
    assert all(getattr(m, f) is None for f in SAVED) and m.saved_total is None
    assert m.saved_method.startswith("not measured here")
    assert m.peak_allocated is not None  # what could be measured still is


def test_measure_says_how_the_saved_bytes_were_taken():
    m = measure(SMOKE.replace(checkpoint="selective"), timed=False)
    assert m.activations == estimate(m.config).activations
    assert "selective checkpointing's cache" in m.saved_method


def test_a_meter_that_misses_sacs_cache_is_caught_by_the_estimate(monkeypatch):
    # The bug as it was on torch 2.11: the cache's tensors invisible, so `selective` read as
    # `full`. Comparing with the estimate tells the learner (a warning and a note under the
    # row) and fails the tests (strict mode, which the test suite and the matrix set).
    monkeypatch.setattr(meter_module, "sac_kept", lambda contexts: [])
    cfg = SMOKE.replace(checkpoint="selective")
    monkeypatch.setenv(STRICT_ENV, "0")
    with pytest.warns(EstimateGap, match=r"saved tensors: measured .* MiB, estimated .* MiB \(-\d+%\)"):
        df = compare([cfg], timed=False, progress=False)
    assert "differs from the analytic estimate" in df["notes"][0]
    monkeypatch.setenv(STRICT_ENV, "1")
    with pytest.raises(AssertionError, match="selective"):
        compare([cfg], timed=False, progress=False)
