"""course_utils.training_arms: lesson 01's arms (fp16 without a scaler, a scaled-down loss), the
flushed share of weight gradients and the harm rule."""
import pytest
from helpers import arm_history

from course_utils.claims import verdict
from course_utils.config import config_for
from course_utils.hardware import HardwareInfo, detect
from course_utils.training_arms import (
    HARM,
    Arm,
    ArmHistory,
    feasible_arms,
    flushed_trend,
    relative_gap,
    results_table,
    shows_harm,
    train_arm,
    train_arms,
)


@pytest.fixture(scope="module")
def tiny():
    # the smoke model, smaller still, so that emulated fp16 on a CPU runs in a blink
    return config_for("smoke", device="cpu", n_layers=1, batch_size=2, seq_len=16)


def test_arm_validation():
    with pytest.raises(ValueError, match="precision"):
        Arm("x", "fp8")
    for bad in (0, -1.0, "1"):
        with pytest.raises(ValueError, match="loss_factor"):
            Arm("x", "fp32", loss_factor=bad)


def test_train_arm_fp32_runs_train_step_and_counts_no_flush(tiny):
    h = train_arm(tiny, Arm("fp32", "fp32"), steps=3, eval_every=2)
    assert isinstance(h, ArmHistory) and h.arm.precision == "fp32"
    assert h.steps == [1, 2, 3] and h.val_steps == [0, 2, 3] and len(h.val_loss) == 3
    assert h.flushed == [0.0, 0.0, 0.0] and h.skipped == [] and h.scales == []
    assert h.seconds > 0
    # the same steps as the course's own train loop: identical losses
    from course_utils.training import setup
    st = setup(tiny)
    ref = [st.step().item() for _ in range(3)]
    assert h.train_loss == pytest.approx(ref, rel=1e-6)


def test_loss_factor_leaves_reported_losses_and_fp32_adam_nearly_alone(tiny):
    a = train_arm(tiny, Arm("a", "fp32"), 3, 3)
    b = train_arm(tiny, Arm("b", "fp32", loss_factor=2.0**-4), 3, 3)
    assert b.train_loss[0] == pytest.approx(a.train_loss[0], rel=1e-6)  # the plain loss is reported
    assert b.val_loss[0] == a.val_loss[0]


def test_fp16_without_scaler_flushes_scaled_down_gradients(tiny):
    """The mechanism of §7 (B): with the loss scaled far down, fp16 without a scaler loses a
    large share of its weight gradients; with GradScaler almost none."""
    factor = 2.0**-16
    arms = [Arm("scaler", "fp16", loss_factor=factor),
            Arm("no scaler", "fp16", scaler=False, loss_factor=factor)]
    hs = train_arms(tiny, arms, steps=2, eval_every=2, progress=False)
    assert list(hs) == ["scaler", "no scaler"]
    assert max(hs["no scaler"].flushed) > 0.2
    assert max(hs["scaler"].flushed) < 0.01
    assert hs["no scaler"].scales == [] and len(hs["scaler"].scales) == 2


def test_train_arms_refuses_before_running(tiny):
    with pytest.raises(ValueError, match="at least one"):
        train_arms(tiny, [], 2)
    with pytest.raises(ValueError, match="differ"):
        train_arms(tiny, [Arm("a", "fp32"), Arm("a", "bf16")], 2)
    big = config_for("cpu", device="cpu")     # fp16 at the cpu profile: emulated and refused
    if not detect("cpu").fp16_fast:
        with pytest.raises(ValueError, match="emulated"):
            train_arms(big, [Arm("fp16", "fp16")], 2, progress=False)
    with pytest.raises(ValueError, match="steps"):
        train_arm(tiny, Arm("a", "fp32"), 0, 1)


def test_harm_rule_and_results_table():
    hs = {"ref": arm_history("ref", [5.0, 4.0], [0, 0]),
          "close": arm_history("close", [5.0, 4.0 * (1 + HARM / 2)], [0.1, 0.3]),
          "far": arm_history("far", [5.0, 4.0 * (1 + 1.5 * HARM)], [0.2, 0.6])}
    assert relative_gap(hs, "far", "ref") == pytest.approx(1.5 * HARM)
    assert not shows_harm(hs, "close", "ref") and shows_harm(hs, "far", "ref")
    t = results_table(hs, "ref")
    assert t.loc["far", "flushed % (mean)"] == pytest.approx(40.0)
    assert t.loc["far", "flushed % (last step)"] == pytest.approx(60.0)
    assert t.loc["ref", "vs ref %"] == 0
    assert "seconds" not in t.columns   # a run's wall time (model, evaluation, maybe emulated) is no speed
    with pytest.raises(ValueError, match="reference"):
        results_table(hs, "nope")
    # C13's threshold and the lesson's harm threshold agree
    gap = relative_gap(hs, "close", "ref")
    assert verdict("C13", same_range=True, flushed_bf16=0.0, val_loss_gap=gap).status == "held"
    gap = relative_gap(hs, "far", "ref")
    assert verdict("C13", same_range=True, flushed_bf16=0.0, val_loss_gap=gap).status == "busted"


def test_flushed_trend_says_how_the_share_moved():
    """The sentence under table (A) is generated from the per-step shares: a hump (the 100-step
    runs), a rise (a 20-step run that stops on the rising side), a fall, and none at all."""
    hump = [0.0] * 10 + [0.01 * i for i in range(1, 11)] + [0.1 - 0.01 * i for i in range(1, 11)] \
        + [0.0001] * 70
    text = flushed_trend(arm_history("h", [1.0], hump))
    assert text.startswith("rose to 10% at step 20 and fell back") and "steps 81-100" in text
    assert "0.01%" in text                      # the last fifth's mean, 0.0001 as a percentage
    assert flushed_trend(arm_history("r", [1.0], [0.001 * i for i in range(1, 21)])).startswith(
        "rose from 0.25% (mean of steps 1-4) to 1.9% (mean of steps 17-20)")
    assert flushed_trend(arm_history("f", [1.0], [0.03, 0.02, 0.01, 0.005, 0.001])) == \
        "fell from 3% (step 1) to 0.1% (step 5)"
    assert flushed_trend(arm_history("z", [1.0], [0.0] * 5)).startswith("stayed at 0%")
    assert flushed_trend(arm_history("l", [1.0], [0.01, 0.011, 0.01])).startswith("stayed about level")
    with pytest.raises(ValueError, match="flushed"):
        flushed_trend(arm_history("e", [1.0], []))


def test_flushed_trend_in_korean_is_one_sentence_per_case_with_the_same_numbers(monkeypatch):
    """Issue 28: under COURSE_LANG=ko each case is its own Korean template (Korean word order),
    filled with the same shares and steps as the English sentence."""
    monkeypatch.setenv("COURSE_LANG", "ko")
    assert flushed_trend(arm_history("f", [1.0], [0.03, 0.02, 0.01, 0.005, 0.001])) == \
        "감소함: 3%(스텝 1) → 0.1%(스텝 5)"
    assert flushed_trend(arm_history("r", [1.0], [0.001 * i for i in range(1, 21)])) == \
        "증가함: 0.25%(스텝 1-4 평균) → 1.9%(스텝 17-20 평균)"
    assert flushed_trend(arm_history("z", [1.0], [0.0] * 5)) == "5개 스텝 모두에서 0%로 유지됨"
    assert flushed_trend(arm_history("u", [1.0], [1e-6] * 3)) == \
        "거의 일정하게 유지됨: 0.001% 미만(스텝 1), 0.001% 미만(스텝 3)"


T4 = HardwareInfo(device="cuda", name="Tesla T4", compute_capability=(7, 5), native_bf16=False,
                  fp16_fast=True, bf16_emulated=True)


def test_feasible_arms_leaves_out_what_the_guard_refuses(tiny):
    arms = [Arm("fp32", "fp32"), Arm("bf16", "bf16"), Arm("fp16", "fp16", scaler=False)]
    kept, left_out = feasible_arms(tiny, arms, T4)
    assert [a.label for a in kept] == ["fp32", "fp16"]
    assert [(a.label, "bf16 on Tesla T4 is emulated" in why) for a, why in left_out] == [("bf16", True)]
    assert feasible_arms(tiny, arms, detect("cpu")) == (arms, [])   # the smoke sizes run on any CPU

