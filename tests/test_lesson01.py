"""Lesson 01 (AMP review) and its helpers: the lesson's recipes are the course's train_step, its
verdicts come from the claims engine, its charts display, its prose types no measured figure;
autocast's policy read on this device; GradScaler's trace read for C12; the update measured for
C18; the accuracy arms of §7 (fp16 without a scaler, a scaled-down loss, the flushed share)."""
import ast
import inspect
import re
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import torch

from course_utils import plots
from course_utils.accuracy import (
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
from course_utils.claims import verdict
from course_utils.config import config_for
from course_utils.guard import check_feasible
from course_utils.hardware import HardwareInfo, detect, is_emulated
from course_utils.loss_scaling import read_scaler_trace, snapshot, update_norm
from course_utils.models import build_model
from course_utils.recorder import POLICY_PROBES, OpDtypeRecorder, autocast_policy
from course_utils.training import train_step

ROOT = Path(__file__).resolve().parents[1]
LESSON = ROOT / "notebooks" / "01_amp_review.ipynb"
CLAIMS_TESTED = ("C1", "C2", "C11", "C12", "C13", "C16", "C18")


@pytest.fixture(scope="module")
def lesson():
    return nbformat.read(LESSON, as_version=4)


def _cell(nb, cell_id):
    return next(c for c in nb.cells if c.get("id") == cell_id)


def _code(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def _python(source):
    """A cell's source without IPython magics (``%matplotlib inline``)."""
    return "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("%"))


# ------------------------------------------------------------------ the lesson is the library's

def test_accumulation_cell_is_train_step_word_for_word(lesson):
    assert _cell(lesson, "recipe-accum").source.strip() == inspect.getsource(train_step).strip()


def _recipes(lesson):
    ns = {"torch": torch}
    for cell_id in ("recipe-bf16", "recipe-fp16"):
        exec(compile(_cell(lesson, cell_id).source, cell_id, "exec"), ns)  # noqa: S102 - the lesson's cell
    return ns["bf16_step"], ns["fp16_step"]


def _fresh(cfg):
    model = build_model(cfg)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_lesson_recipes_do_what_train_step_does(lesson, precision):
    """bf16_step / fp16_step of §5, step for step, leave the same parameters as the course's
    train_step with one micro-batch (GradScaler disabled for bf16, enabled for fp16)."""
    bf16_step, fp16_step = _recipes(lesson)
    cfg = config_for("smoke", device="cpu")
    batches = [get_batch_pair(cfg, i) for i in range(2)]
    (m1, o1), (m2, o2) = _fresh(cfg), _fresh(cfg)
    s1 = torch.amp.GradScaler("cpu", enabled=precision == "fp16")
    s2 = torch.amp.GradScaler("cpu", enabled=precision == "fp16")
    for x, y in batches:
        if precision == "bf16":
            bf16_step(m1, o1, x, y)
        else:
            fp16_step(m1, o1, s1, x, y)
        train_step(m2, o2, s2, [(x, y)], torch.bfloat16 if precision == "bf16" else torch.float16)
    assert all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters()))
    assert s1.get_scale() == s2.get_scale()
    # and the parameters did move (a recipe that skipped the step would also "agree")
    assert not all(torch.equal(p, q) for p, q in zip(m1.parameters(), build_model(cfg).parameters()))


def test_the_recipes_markdown_promises_no_bitwise_equality(lesson):
    """An H100 printed 'same parameters: False' under "it does exactly what bf16_step does": the
    markdown says what the check prints, not which answer to expect."""
    text = _cell(lesson, "recipe-accum-md").source
    assert "exactly what" not in text and "bitwise equal" in text and "GPU" in text


def get_batch_pair(cfg, i):
    from course_utils.data import get_batch
    return get_batch(cfg.batch_size, cfg.seq_len, step=i)


def test_verdicts_come_from_the_engine_one_call_per_claim(lesson):
    code = "\n".join(_python(c.source) for c in _code(lesson))
    assert "Verdict(" not in code and "import Verdict" not in code
    for claim in CLAIMS_TESTED:
        assert len(re.findall(rf'verdict\("{claim}"', code)) == 1, claim
    calls = re.findall(r'verdict\("(C\d+)"', code)
    assert sorted(calls) == sorted(CLAIMS_TESTED)
    # no label typed by the lesson: no status word assigned or compared in code
    assert not re.search(r'"(held|busted|failed|depends|not measured here)"', code)


def test_chart_cells_end_with_the_chart_call(lesson):
    charts = set(plots.__all__) - {"MiB"}
    seen = 0
    for c in _code(lesson):
        tree = ast.parse(_python(c.source))
        called = {n.func.id for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)} & charts
        if not called:
            continue
        seen += 1
        last = tree.body[-1]
        assert isinstance(last, ast.Expr) and isinstance(last.value, ast.Call) \
            and getattr(last.value.func, "id", None) in charts, c.id
        assert not c.source.rstrip().endswith(";"), c.id
        if getattr(last.value.func, "id", "") not in ("styled_claims", "format_range_chart"):
            kwargs = {k.arg for k in last.value.keywords}
            assert "size" in kwargs or "title" in kwargs, f"{c.id}: say which model/size"
    assert seen >= 7


def test_prose_types_no_measured_ratio(lesson):
    """Markdown states no speed or memory ratio (e.g. "fp16 ~200x slower", "0.03x"): those are
    printed from this run's numbers."""
    ratio = re.compile(r"~?\b\d+(?:\.\d+)?\s?x\b(?!\s*\d)")
    for c in lesson.cells:
        if c.cell_type == "markdown":
            found = [m.group(0) for m in ratio.finditer(c.source)]
            assert not found, f"{c.id}: {found}"
    assert "fp16 ~200x" not in "".join(c.source for c in lesson.cells)


def test_setup_chooses_threads_once_and_probes(lesson):
    code = "\n".join(_python(c.source) for c in _code(lesson))
    assert code.count("use_threads()") == 1
    setup = _cell(lesson, "setup").source
    assert "use_threads()" in setup and "matmul_probe(" in setup and "report(hw, probe)" in setup


def test_lesson_starts_with_objectives_and_ends_with_summary(lesson):
    assert "objective" in lesson.cells[0].source.lower()
    assert "Summary" in lesson.cells[-1].source and "Try next" in lesson.cells[-1].source


# ------------------------------------------------------------------ autocast's policy, measured

def test_autocast_policy_reads_this_devices_lists():
    t = autocast_policy("cpu", torch.bfloat16)
    assert list(t.index) == list(POLICY_PROBES)
    assert list(t.columns) == ["fp32 input", "bf16 input", "autocast here"]
    assert t.loc["linear (matmul)", "autocast here"] == "runs in bf16"
    assert t.loc["cross_entropy (the loss)", "autocast here"] == "runs in fp32"
    # the step inside it: CPU autocast casts cross_entropy's input up, so its log-softmax (saved
    # for backward) is fp32 here; on CUDA only nll_loss is listed and it follows its input
    assert t.loc["log_softmax inside cross_entropy", "bf16 input"] == "fp32"
    # CPU autocast (unlike CUDA's list) leaves layer_norm and softmax of a bf16 input in bf16
    assert t.loc["layer_norm", "autocast here"] == "follows its input"
    assert t.loc["softmax", "bf16 input"] == "bf16"
    t16 = autocast_policy("cpu", torch.float16)
    assert t16.loc["linear (matmul)", "fp32 input"] == "fp16"
    with pytest.raises(ValueError, match="float16 or torch.bfloat16"):
        autocast_policy("cpu", torch.float32)
    with pytest.raises(ValueError):
        autocast_policy("cuda:7" if not torch.cuda.is_available() else "nonsense")


def test_ops_by_dtype_groups_a_recording():
    cfg = config_for("smoke", device="cpu")
    model = build_model(cfg)
    x, y = get_batch_pair(cfg, 0)
    with OpDtypeRecorder(model) as rec, torch.autocast("cpu", dtype=torch.bfloat16):
        model(x, y)
    block = rec.ops_by_dtype(module="layers.0")
    assert "addmm" in block["bf16"] and "native_layer_norm" in block["fp32"]
    seen = [op for ops in block.values() for op in ops]
    assert "_to_copy" not in seen and "view" not in seen
    assert all(len(v) == len(set(v)) for v in block.values())
    everything = rec.ops_by_dtype()
    assert "nll_loss_forward" in everything["fp32"] and "nll_loss_forward" not in block.get("fp32", [])
    outside = rec.ops_by_dtype(exclude="layers")
    assert "nll_loss_forward" in outside["fp32"] and "embedding" in outside["fp32"]
    assert "gelu" not in [op for ops in outside.values() for op in ops]


def test_what_is_saved_in_fp32_is_read_from_the_recording(lesson):
    """On CUDA cross_entropy's log-softmax ran in bf16 (an H100 recorded `_log_softmax` with a bf16
    output) while the markdown said it was saved in fp32: the lesson prints the fp32 ops from
    its recording and says where the log-softmax is fp32 only with its condition."""
    assert 'ops.ops_by_dtype(exclude="layers").get("fp32"' in _cell(lesson, "cache").source
    for cell_id in ("cache-read", "why-not-half"):
        text = _cell(lesson, cell_id).source
        assert "log-softmax" not in text or "on a CPU" in text, cell_id


# ------------------------------------------------------------------ GradScaler, C12 and C18

def _trace(inject, growth_interval=3, steps=12, tamper=None):
    torch.manual_seed(0)
    toy = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(toy.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", growth_interval=growth_interval)
    init = scaler.get_scale()
    rows = []
    for step in range(1, steps + 1):
        scaler.scale(toy(torch.randn(8, 4)).pow(2).mean()).backward()
        if step in inject:
            toy.weight.grad[0, 0] = inject[step]
        before = toy.weight.detach().clone()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        rows.append({"step": step, "injected": step in inject, "scale": scaler.get_scale(),
                     "stepped": not torch.equal(before, toy.weight.detach())})
    if tamper:
        tamper(rows)
    return pd.DataFrame(rows), scaler, init


def test_read_scaler_trace_on_torchs_gradscaler():
    trace, scaler, init = _trace({2: float("inf"), 3: float("nan")})
    got = read_scaler_trace(trace, scaler, init)
    assert got == {"backoffs_ok": [True, True], "growth_after": [3, 3, 3],
                   "growth_interval": 3, "clean_taken": True}
    assert verdict("C12", **got).status == "held"
    # the same from a list of dicts
    assert read_scaler_trace(trace.to_dict("records"), scaler, init) == got


def test_read_scaler_trace_catches_a_broken_rule():
    def no_backoff(rows):  # a scaler that kept its scale after an overflow
        for r in rows:
            r["scale"] = rows[0]["scale"] if r["step"] <= 4 else r["scale"]

    trace, scaler, init = _trace({2: float("inf")}, tamper=no_backoff)
    got = read_scaler_trace(trace, scaler, init)
    assert got["backoffs_ok"] == [False]
    assert verdict("C12", **got).status == "busted"

    def stepped_on_inf(rows):
        rows[1]["stepped"] = True

    trace, scaler, init = _trace({2: float("inf")}, tamper=stepped_on_inf)
    assert read_scaler_trace(trace, scaler, init)["backoffs_ok"] == [False]
    with pytest.raises(ValueError, match="rows with"):
        read_scaler_trace([{"step": 1}], scaler, init)
    with pytest.raises(ValueError):
        read_scaler_trace([], scaler, init)


def test_update_norm_measures_the_change():
    lin = torch.nn.Linear(3, 2)
    before = snapshot(lin)
    assert update_norm(lin, before) == 0.0
    with torch.no_grad():
        lin.weight[0, 0] += 3.0
        lin.bias[1] -= 4.0
    assert update_norm(lin, before) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="snapshot"):
        update_norm(lin, before[:1])


def _one_update(make_optimizer, unscale_first, cfg):
    model = build_model(cfg)
    opt = make_optimizer(model.parameters())
    scaler = torch.amp.GradScaler("cpu")
    before = snapshot(model)
    _, loss = model(*get_batch_pair(cfg, 0))
    scaler.scale(loss).backward()
    if unscale_first:
        scaler.unscale_(opt)
        seen = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
    else:
        seen = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    return seen, update_norm(model, before)


def test_c18_mechanism_sgd_feels_the_scale_adamw_mostly_not():
    """Clipping before unscale_: the norm clipping sees is S x the true one; SGD's update
    shrinks by about the scale; AdamW's changes by far less (its normalisation hides it)."""
    cfg = config_for("smoke", device="cpu")
    S = torch.amp.GradScaler("cpu").get_scale()
    sgd = {o: _one_update(lambda p: torch.optim.SGD(p, lr=1e-3), o, cfg) for o in (True, False)}
    adam = {o: _one_update(lambda p: torch.optim.AdamW(p, lr=1e-3), o, cfg) for o in (True, False)}
    saw = sgd[False][0] / sgd[True][0]
    assert saw == pytest.approx(S, rel=1e-3)
    sgd_ratio = sgd[False][1] / sgd[True][1]
    adam_ratio = adam[False][1] / adam[True][1]
    assert sgd_ratio < 10 / S                  # about 1/S x (true norm / max_norm)
    assert 0.1 < adam_ratio <= 1.0             # Adam hides most of it
    v = verdict("C18", clip_saw_ratio=saw, scale=S, sgd_update_ratio=sgd_ratio,
                adamw_update_ratio=adam_ratio)
    assert v.status == "held" and "SGD" in v.evidence and "AdamW" in v.evidence


# ------------------------------------------------------------------ §7: accuracy arms

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


def _history(label, losses, flushed):
    h = ArmHistory(config_for("smoke", device="cpu"), arm=Arm(label, "fp32"))
    h.val_steps, h.val_loss = list(range(len(losses))), list(losses)
    h.steps, h.flushed = list(range(1, len(flushed) + 1)), list(flushed)
    return h


def test_harm_rule_and_results_table():
    hs = {"ref": _history("ref", [5.0, 4.0], [0, 0]),
          "close": _history("close", [5.0, 4.0 * (1 + HARM / 2)], [0.1, 0.3]),
          "far": _history("far", [5.0, 4.0 * (1 + 1.5 * HARM)], [0.2, 0.6])}
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
    text = flushed_trend(_history("h", [1.0], hump))
    assert text.startswith("rose to 10% at step 20 and fell back") and "steps 81-100" in text
    assert "0.01%" in text                      # the last fifth's mean, 0.0001 as a percentage
    assert flushed_trend(_history("r", [1.0], [0.001 * i for i in range(1, 21)])).startswith(
        "rose from 0.25% (mean of steps 1-4) to 1.9% (mean of steps 17-20)")
    assert flushed_trend(_history("f", [1.0], [0.03, 0.02, 0.01, 0.005, 0.001])) == \
        "fell from 3% (step 1) to 0.1% (step 5)"
    assert flushed_trend(_history("z", [1.0], [0.0] * 5)).startswith("stayed at 0%")
    assert flushed_trend(_history("l", [1.0], [0.01, 0.011, 0.01])).startswith("stayed about level")
    with pytest.raises(ValueError, match="flushed"):
        flushed_trend(_history("e", [1.0], []))


def test_lesson_tells_the_flushed_trend_from_its_run(lesson):
    assert "flushed_trend(plain[" in _cell(lesson, "train-table").source
    read = _cell(lesson, "train-read").source
    assert "usually grows" not in read and "line printed above table (A)" in read


T4 = HardwareInfo(device="cuda", name="Tesla T4", compute_capability=(7, 5), native_bf16=False,
                  fp16_fast=True, bf16_emulated=True)


def test_feasible_arms_leaves_out_what_the_guard_refuses(tiny):
    arms = [Arm("fp32", "fp32"), Arm("bf16", "bf16"), Arm("fp16", "fp16", scaler=False)]
    kept, left_out = feasible_arms(tiny, arms, T4)
    assert [a.label for a in kept] == ["fp32", "fp16"]
    assert [(a.label, "bf16 on Tesla T4 is emulated" in why) for a, why in left_out] == [("bf16", True)]
    assert feasible_arms(tiny, arms, detect("cpu")) == (arms, [])   # the smoke sizes run on any CPU


def test_section7_runs_on_a_t4_with_arms_the_guard_accepts(lesson, capsys):
    """On a Colab T4, the GPU "Try next" recommends, the guard refuses bf16 (emulated): §7 once
    stopped there, and its table and C13 failed after it. The lesson's own cells of §7, run with
    a T4's HardwareInfo, hand train_arms only arms the guard accepts on a T4, say what they left
    out, and judge C13 without a bf16 training run."""
    from course_utils.formats import format_table
    calls = []

    def train_arms_on_t4(config, arms, steps, **kwargs):
        for a in arms:  # what train_arms asks first, here on the T4
            check_feasible(config.replace(precision=a.precision), T4)
        calls.append([a.label for a in arms])
        return {a.label: _history(a.label, [5.0, 4.0], [0.0] * steps) for a in arms}

    import math
    ns = {"math": math, "hw": T4, "is_emulated": is_emulated, "DEVICE": "cpu", "size": "cpu",
          "config_for": config_for,
          "Arm": Arm, "feasible_arms": feasible_arms, "train_arms": train_arms_on_t4,
          "loss_curves_chart": lambda *a, **k: None, "results_table": results_table,
          "relative_gap": relative_gap, "shows_harm": shows_harm, "flushed_trend": flushed_trend,
          "verdict": verdict, "verdicts": [], "bf16_plain": {"flushed": 0.0},
          "table": format_table()}
    for cell_id in ("train", "train-table", "c13", "train-scaled", "train-scaled-table"):
        exec(compile(_python(_cell(lesson, cell_id).source), cell_id, "exec"), ns)  # noqa: S102
    out = capsys.readouterr().out
    assert calls[0] == ["fp32", "fp16, no scaler"]                 # (A) without bf16
    assert calls[1] == ["fp32", "fp16 + GradScaler", "fp16, no scaler"]   # (B) as everywhere
    assert "(A) leaves out bf16: bf16 on Tesla T4 is emulated" in out and "(A) 2 runs" in out
    c13 = ns["verdicts"][-1]
    assert c13.claim == "C13" and "validation loss" not in c13.evidence


def test_loss_curves_chart_with_the_flushed_share():
    hs = {"fp32": _history("fp32", [5.0, 4.0], [0, 0]),
          "fp16, no scaler": _history("fp16, no scaler", [5.0, 4.5], [0.2, 0.4])}
    fig = plots.loss_curves_chart(hs, title="(B) test", size="smoke", flushed=True)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 2
    assert "size 'smoke'" in fig.get_suptitle()
    assert "flushed" in axes[1].get_title()
    flushed_line = axes[1].get_lines()[1]
    assert list(flushed_line.get_ydata()) == [20.0, 40.0]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "fp16, no scaler: 4.500, flushed 30%" in labels
    # without flushed=True: the zoom on the second half, as before
    zoom = plots.loss_curves_chart(hs)
    assert "zoom" in [ax for ax in zoom.axes if ax.get_visible()][1].get_title()
    with pytest.raises(ValueError, match="flushed"):
        plots.loss_curves_chart({"x": _history("x", [1.0], [])}, flushed=True)
    with pytest.raises(ValueError, match="flushed"):
        plots.loss_curves_chart({"x": ([0, 1], [2.0, 1.0])}, flushed=True)


def test_lesson01_has_one_measuring_box_and_speaks_of_its_subject(lesson):
    from test_telling import machinery_share  # the issue-18 checker of lessons 03/04, the same rule
    boxes = [c for c in lesson.cells if c.get("id") == "how-measured"]
    assert len(boxes) == 1 and "How this lesson measures" in boxes[0].source
    assert machinery_share(lesson) <= 0.05, f"{machinery_share(lesson):.1%} machinery words"
    prose = " ".join(c.source for c in lesson.cells if c.cell_type == "markdown")
    assert "TF32" in prose and "failed" not in prose
