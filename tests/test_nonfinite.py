"""course_utils.nonfinite and train_step's guard: the two injected faults (a NaN in a weight, an
inf from an overflow) on a real step of the course model; what fp16 + GradScaler and bf16 do with
them; each guard catches both; the skip leaves the parameters and AdamW's state as they were; with
nothing wrong, the guarded step is the unguarded one, bit for bit."""
import pytest
import torch

from course_utils.config import config_for
from course_utils.data import get_batch
from course_utils.loss_scaling import snapshot
from course_utils.models import build_model
from course_utils.nonfinite import (
    GUARDS,
    FirstNonFinite,
    changed_parameters,
    guarded_step,
    nan_in_weight,
    nonfinite_parameters,
    overflow,
)
from course_utils.training import StepCounter, train, train_step

SMOKE = config_for("smoke", device="cpu")
WEIGHT, MODULE = "layers.0.mlp.fc1.weight", "layers.0.mlp.fc1"
BATCH = [get_batch(SMOKE.batch_size, SMOKE.seq_len, seed=3)]


def fresh():
    model = build_model(SMOKE)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def step(model, optimizer, precision, nonfinite="skip"):
    scaler = torch.amp.GradScaler("cpu", enabled=precision == "fp16")
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    with StepCounter(optimizer) as counter:
        train_step(model, optimizer, scaler, BATCH, dtype, nonfinite=nonfinite)
    return counter.taken, scaler


def faulty(fault):
    """A fresh model and optimizer, and the context its step runs in, for ``fault``."""
    model, optimizer = fresh()
    if fault == "nan in a weight":
        nan_in_weight(model, WEIGHT)
        return model, optimizer, torch.enable_grad()
    return model, optimizer, overflow(model, MODULE)


FAULTS = ("nan in a weight", "overflow")


@pytest.mark.parametrize("fault", FAULTS)
def test_without_a_scaler_one_bad_step_turns_every_parameter_into_nan(fault):
    """What bf16 does (no scaler) when nothing guards the step: the NaN gradient norm makes
    clip_grad_norm_ multiply every gradient by NaN, and AdamW writes NaN into every parameter."""
    model, optimizer, ctx = faulty(fault)
    with ctx:
        taken, _ = step(model, optimizer, "bf16", nonfinite="step")
    assert taken == 1
    assert nonfinite_parameters(model) == [n for n, _ in model.named_parameters()]


@pytest.mark.parametrize("fault", FAULTS)
def test_fp16_with_gradscaler_skips_the_step_and_backs_off_whatever_the_guard(fault):
    for nonfinite in ("skip", "raise", "step"):   # the scaler's own skip: the guard stays out
        model, optimizer, ctx = faulty(fault)
        before = snapshot(model)
        with ctx:
            taken, scaler = step(model, optimizer, "fp16", nonfinite=nonfinite)
        assert taken == 0 and scaler.get_scale() == 65536.0 * 0.5
        assert changed_parameters(model, before) == 0
        # the skip does not repair a NaN weight: it is still there for the next step
        assert nonfinite_parameters(model) == ([WEIGHT] if fault == "nan in a weight" else [])


@pytest.mark.parametrize("fault", FAULTS)
def test_the_skip_leaves_parameters_and_adamw_state_unchanged(fault):
    model, optimizer, ctx = faulty(fault)
    before = snapshot(model)
    with ctx:
        taken, _ = step(model, optimizer, "bf16")           # the default: "skip"
    assert taken == 0 and changed_parameters(model, before) == 0
    assert optimizer.state == {} or all(not s for s in optimizer.state.values())
    assert all(p.grad is None for p in model.parameters())  # zero_grad ran: the next step is clean


def test_with_nothing_wrong_the_guarded_step_is_the_unguarded_one_bit_for_bit():
    grads, params = [], []
    for nonfinite in ("skip", "raise", "step"):
        model, optimizer = fresh()
        seen = {}
        optimizer.register_step_pre_hook(
            lambda opt, a, k, seen=seen, model=model: seen.update(
                {n: p.grad.clone() for n, p in model.named_parameters()}))
        for _ in range(2):
            taken, _ = step(model, optimizer, "bf16", nonfinite=nonfinite)
            assert taken == 1
        grads.append(seen)
        params.append(snapshot(model))
    for g, p in zip(grads[1:], params[1:]):
        assert all(torch.equal(g[n], grads[0][n]) for n in g)
        assert all(torch.equal(a, b) for a, b in zip(p, params[0]))
    assert changed_parameters(fresh()[0], params[0]) > 0      # and the steps did move them


@pytest.mark.parametrize("fault", FAULTS)
def test_each_guard_catches_each_injected_fault(fault):
    reports = {}
    for guard in GUARDS:
        model, optimizer, ctx = faulty(fault)
        with ctx:
            reports[guard] = guarded_step(guard, model, optimizer, BATCH, torch.bfloat16)
    assert reports["none"] == ""
    assert reports["skip"] == "skipped the step"
    assert "non-finite" in reports["error_if_nonfinite"]
    # detect_anomaly stops at the first backward function that returned NaN (the loss's
    # log-softmax), and names the forward line that created it
    assert "returned nan values" in reports["detect_anomaly"] and "models.py" in reports["detect_anomaly"]
    assert reports["forward hooks"] == f"first non-finite output: {MODULE}"


def test_guards_report_nothing_on_a_clean_step_and_refuse_bad_input():
    for guard in GUARDS:
        model, optimizer = fresh()
        assert guarded_step(guard, model, optimizer, BATCH, torch.bfloat16) == ""
        assert nonfinite_parameters(model) == []
    model, optimizer = fresh()
    with pytest.raises(ValueError, match="unknown guard"):
        guarded_step("pray", model, optimizer, BATCH)
    with pytest.raises(ValueError, match="GradScaler"):
        guarded_step("skip", model, optimizer, BATCH, torch.float16)
    with pytest.raises(ValueError, match="nonfinite must be"):
        train_step(model, optimizer, torch.amp.GradScaler("cpu", enabled=False), BATCH,
                   nonfinite="ignore")
    with pytest.raises(ValueError, match="no parameter 'nope'"):
        nan_in_weight(model, "nope")
    with pytest.raises(ValueError, match="outside"):
        nan_in_weight(model, WEIGHT, index=10**9)
    with pytest.raises(ValueError, match="no submodule"):
        with overflow(model, "layers.9"):
            pass


def test_the_overflow_is_an_inf_in_the_modules_own_dtype_and_the_hooks_see_it():
    model, _ = fresh()
    x, _ = BATCH[0]
    with FirstNonFinite(model) as clean:
        model(x)
    assert clean.module is None
    for dtype in (torch.float16, torch.bfloat16):   # 65504 in fp16, ~3.4e38 in bf16: both inf
        outs = {}
        seen = model.get_submodule(MODULE).register_forward_hook(
            lambda m, i, o, outs=outs: outs.update(out=o))
        with FirstNonFinite(model) as first, overflow(model, MODULE), \
                torch.autocast("cpu", dtype=dtype):
            model(x)
        seen.remove()
        assert outs["out"].dtype == dtype and torch.isinf(outs["out"]).any()
        assert first.module == MODULE


def test_train_counts_the_steps_the_guard_skipped_in_every_precision(monkeypatch):
    """train()'s history counts a skipped step from the optimizer's own step hook, so a step the
    guard skipped in bf16 is counted as GradScaler's are in fp16."""
    import course_utils.training as training
    real = training.train_step

    def poisoned(model, optimizer, scaler, micro_batches, *args, **kwargs):
        with overflow(model, MODULE):
            return real(model, optimizer, scaler, micro_batches, *args, **kwargs)
    monkeypatch.setattr(training.TrainState, "step", lambda self: poisoned(
        self.model, self.optimizer, self.scaler, self.next_micro_batches(), self.config.dtype,
        self.max_grad_norm))
    for precision in ("bf16", "fp16"):
        hist = train(SMOKE.replace(precision=precision), steps=3, eval_every=3, progress=False)
        assert hist.skipped == [1, 2, 3], precision
