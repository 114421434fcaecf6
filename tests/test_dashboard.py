"""The live dashboard (course_utils.dashboard) without a kernel: set controls, click Run (run
synchronously, or on its worker thread), read the history, the messages and the chart.

Runs on ipywidgets 8 (the main venv) and 7.7 (Colab's; `make test` runs this file again with
ipywidgets 7.7 in front of the venv's site-packages).
"""
import gc
import html
import io
import os
import re
import sys
import threading
import time
import types

import ipywidgets
import pytest
import torch
from matplotlib.figure import Figure

from course_utils import guard
from course_utils.config import config_for
from course_utils.dashboard import Dashboard, dashboard, history_table, oom_suggestions
from course_utils.dashboard import widget as W
from course_utils.dashboard.run import StepClock, calibration_config, effective_flops, run_configs
from course_utils.experiments import _table
from course_utils.hardware import HardwareInfo, detect, is_emulated, recommend_precision
from course_utils.measure import Measurement
from course_utils.memory_model import estimate
from course_utils.plots import dashboard_chart
from course_utils.terms import GiB, MiB
from course_utils.training import train_step

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# A laptop CPU with AVX2 only: recipe fp32, bf16 emulated (timed with one step, labelled).
AVX2 = HardwareInfo(device="cpu", name="AVX2 laptop (test)", native_bf16=False, fp16_fast=False,
                    cpu_features={"avx2": True}, bf16_emulated=True)
# A CPU with AMX: recipe bf16, so the baseline is bf16, not fp32.
AMX = HardwareInfo(device="cpu", name="AMX CPU (test)", native_bf16=True, fp16_fast=False,
                   cpu_features={"avx512_f": True, "avx512_bf16": True, "amx_bf16": True})
T4 = HardwareInfo(device="cuda", name="Tesla T4", compute_capability=(7, 5), native_bf16=False,
                  fp16_fast=True, total_memory_bytes=15 * 2**30, bf16_emulated=True)
TIME_WORDS = re.compile(r"\b(faster|slower)\b")


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def body_rows(html_table: str) -> int:
    return html_table.split("<tbody>")[1].count("<tr") if "<tbody>" in html_table else 0


def seeded_clock(*configs, seconds=0.01) -> StepClock:
    """A clock that knows the step time of ``configs`` (no calibration: fake hardware)."""
    clock = StepClock()
    for c in configs:
        clock.record(c, seconds)
    return clock


class FakeCompare:
    """`compare` for hardware we do not have: memory from the analytic model, step times per
    round from ``times(config)``, and the real table builder (ratios, noise verdicts)."""

    def __init__(self, times=lambda c: [0.01] * 5, oom_if=lambda c: False, size="smoke"):
        self.times, self.oom_if, self.size, self.calls = times, oom_if, size, []

    def __call__(self, configs, budget_s=None, step_fn=None, hw=None, force=False,
                 progress=False):
        self.calls.append([(c, force) for c in configs])
        ms = []
        for c in configs:
            m = Measurement(config=c, device_name="fake", emulated=is_emulated(hw, c.precision))
            if self.oom_if(c):
                m.oom, m.error = True, f"out of memory on the fake GPU at batch {c.batch_size}"
            else:
                e = estimate(c)
                for f in ("parameters", "gradients", "optimizer_state", "activations",
                          "autocast_weight_copies", "logits", "peak_allocated"):
                    setattr(m, f, getattr(e, f))
                m.add_times(self.times(c))
                m.timing = f"{len(m.step_times_s)} steps in alternation with the other rows"
            ms.append(m)
        return _table(ms, self.size)

    @property
    def labels(self):
        return [[c.label for c, _ in call] for call in self.calls]


class CostlyStep:
    """The real training step, then a sleep proportional to parameters x tokens (so its cost
    scales like FLOPs and dominates): a step whose cost the test controls."""

    def __init__(self, seconds_per_param_token=1e-8):
        self.k, self.calls = seconds_per_param_token, 0

    def __call__(self, model, optimizer, scaler, micro_batches, dtype=None, max_grad_norm=1.0):
        out = train_step(model, optimizer, scaler, micro_batches, dtype, max_grad_norm)
        tokens = sum(x.numel() for x, _ in micro_batches)
        time.sleep(self.k * tokens * sum(p.numel() for p in model.parameters()))
        self.calls += 1
        return out


@pytest.fixture
def quick_chart(monkeypatch):
    """A tiny stand-in for the dashboard's chart, where a test is not about the chart (drawing
    the real one takes seconds on a loaded 2-core machine)."""
    calls = []

    def chart(df, size=None):
        calls.append(len(df))
        fig = Figure(figsize=(1, 1))
        fig.text(0.5, 0.5, str(len(df)))
        return fig
    monkeypatch.setattr(W, "dashboard_chart", chart)
    return calls


def png_of(d) -> bytes:
    buf = io.BytesIO()
    dashboard_chart(d.history, size=d.size).savefig(buf, format="png", dpi=80)
    return buf.getvalue()


# ------------------------------------------------------------------------------------ tests

def test_defaults_come_from_the_size_profile_and_the_recipe(monkeypatch):
    d = dashboard(background=False)  # COURSE_SIZE=smoke (tests/conftest.py)
    base = config_for()
    assert (d.batch_size.value, d.seq_len.value, d.n_layers.value) == \
        (base.batch_size, base.seq_len, base.n_layers)
    assert d.grad_accum_steps.value == 1 and d.compile.value is False
    assert d.precision.value == recommend_precision(detect()).precision
    preview = text(d.preview.value)
    assert f"{base.batch_size * base.seq_len:,} tokens per step" in preview
    assert "Run first calibrates" in preview and "this configuration is the baseline" in preview
    assert d.history.empty and body_rows(d.table.value) == 0
    assert d.stop_button.disabled and not d.run_button.disabled
    shown = []
    monkeypatch.setattr(W, "display", lambda *objs, **kw: shown.extend(objs))
    d._ipython_display_()  # what IPython calls for a cell's last expression, on 7.x and 8.x
    assert shown == [d.widget] and d.widget.model_id
    assert Dashboard(size="cpu", hw=AVX2).batch_size.value == config_for("cpu").batch_size


def test_precision_and_policy_change_what_is_measured_and_the_chart_follows():
    """Real measurements at the smoke size on an AVX2-like plan (recipe fp32, bf16 emulated):
    the precision control changes the saved dtype and bytes, the policy control the saved bytes;
    the chart is redrawn from the history after every Run."""
    d = Dashboard(size="smoke", hw=AVX2, background=False)
    d.precision.value = "bf16"
    m = d.run()
    h = d.history
    assert m is not None and m.config.precision == "bf16" and not m.oom
    assert h["label"].tolist() == ["fp32", "bf16"] and h["baseline"].tolist() == [True, False]
    assert h["status"].tolist() == ["ok", "ok"] and h["baseline_run"].tolist() == [1, 1]
    assert h["saved_dtypes"][0] == "fp32 100%"
    assert h["saved_dtypes"][1].startswith("bf16 ")  # most saved activation bytes are bf16 now
    assert 0.45 < h["activations"][1] / h["activations"][0] < 0.7  # 2 bytes, not 4 (0.57 here)
    assert h["autocast_weight_copies"][0] == 0 < h["autocast_weight_copies"][1]
    assert h["time_verdict"][1] == "emulated"
    msg = text(d.message.value)
    assert "bf16 (#2) against its baseline fp32 (#1" in msg and "emulated here" in msg
    assert not TIME_WORDS.search(msg) and "course-msg-ok" in d.message.value
    assert body_rows(d.table.value) == 2 and "fp32 (baseline)" in d.table.value
    first_png = bytes(d.chart.value)
    assert first_png.startswith(PNG_MAGIC) and d.chart.layout.display != "none"
    assert d.progress.value == d.progress.max and d.progress.bar_style == "success"
    assert not d.run_button.disabled and d.stop_button.disabled

    d.precision.value = "fp32"
    d.checkpoint.value = "full"
    d.run_button.click()
    d.checkpoint.value = "selective"
    d.run_button.click()
    h = d.history
    assert h["label"].tolist() == ["fp32", "bf16", "fp32", "fp32+full", "fp32", "fp32+selective"]
    full, selective = h["saved_ratio"][3], h["saved_ratio"][5]
    assert full < 0.5 and selective < 0.9 and full < selective  # 0.21 and 0.74 at smoke
    assert h["saved_dtypes"][3] == h["saved_dtypes"][5] == "fp32 100%"
    assert "0.21x" in text(d.message.value) or f"({selective:.2f}x)" in text(d.message.value)
    assert body_rows(d.table.value) == 6
    png = bytes(d.chart.value)
    assert png != first_png and png == png_of(d)  # the chart shows the whole history, redrawn


def test_the_baseline_is_the_recipe_here_not_always_fp32(quick_chart):
    fake = FakeCompare()
    amx = run_configs(config_for("smoke"), AMX)[0]
    d = Dashboard(size="smoke", hw=AMX, compare_fn=fake, background=False,
                  clock=seeded_clock(amx, amx.replace(precision="fp32")))
    assert d.precision.value == "bf16" and "Baseline: bf16" in text(d.preview.value)
    d.checkpoint.value = "full"
    d.run_button.click()
    d.precision.value = "fp32"
    d.checkpoint.value = "none"
    d.run_button.click()
    assert fake.labels == [["bf16", "bf16+full"], ["bf16", "fp32"]]
    assert "fp32 (#4) against its baseline bf16 (#3" in text(d.message.value)

    t4 = config_for("t4", device="cuda")
    fake = FakeCompare()
    d = Dashboard(size="t4", device="cuda", hw=T4, compare_fn=fake, background=False,
                  clock=seeded_clock(t4.replace(precision="fp16")))
    assert d.precision.value == "fp16"  # the recipe for a T4
    d.checkpoint.value = "selective"
    d.run_button.click()
    assert fake.labels == [["fp16", "fp16+selective"]]


@pytest.mark.parametrize("size, times, shown, hidden", [
    # the case: at smoke, full checkpointing at 0.30x the baseline's time
    ("smoke", [0.30, 0.31, 0.29, 0.30, 0.30], "too small to time", "0.30"),
    # a ratio whose per-round spread includes 1
    ("cpu", [0.40, 0.30, 1.20, 0.35, 1.50], "within noise", "0.40"),
    # outside the noise: the ratio and its verdict
    ("cpu", [1.31, 1.30, 1.33, 1.29, 1.32], "1.31x slower than the baseline's", None),
    # a speed-up in its own words: 1.43x faster, never "0.70x ... faster"
    ("cpu", [0.70, 0.71, 0.69, 0.70, 0.70], "1.43x faster than the baseline's", "0.70x"),
])
def test_a_time_ratio_is_shown_only_outside_the_noise(size, times, shown, hidden, quick_chart):
    def fake_times(c):
        return times if c.checkpoint == "full" else [1.0] * 5
    base = config_for(size)
    d = Dashboard(size=size, hw=AVX2, compare_fn=FakeCompare(fake_times, size=size),
                  background=False, clock=seeded_clock(base))
    d.checkpoint.value = "full"
    d.run_button.click()
    msg, table = text(d.message.value), text(d.table.value)
    chart = " ".join(t.get_text() for t in dashboard_chart(d.history).axes[0].texts)
    assert shown in msg
    if hidden is None:
        assert "1.31x slower" in table and "1.31x" in chart and "slower" in chart
        return
    if "faster" in shown:
        assert hidden not in msg and "1.43x faster" in table
        return
    assert hidden not in msg and hidden not in table and hidden not in chart
    assert not TIME_WORDS.search(msg + table + chart)
    assert shown.split()[0] in table and shown.split()[0] in chart


def test_the_guard_predicts_a_run_within_bounds(quick_chart):
    """A step whose cost the test controls (a sleep in proportion to parameters x tokens):
    the predicted seconds of each Run, from a calibration and the steps a Run really takes,
    are within 2x of its measured seconds, and the step count matches the plan (the rounds of
    alternation within half their planned number)."""
    step = CostlyStep(1.2e-8)  # ~0.2 s per step at the smoke size
    d = Dashboard(size="smoke", hw=AVX2, step_fn=step, background=False, budget_s=1.0)
    d.precision.value = "bf16"  # emulated here: one timed step
    checks = []
    for batch in (4, 8, 2):
        d.batch_size.value = batch
        assert d.plan().describe() in text(d.preview.value)  # shown before the Run
        d.run()
        plan = d.last_plan
        assert plan.seconds and d.last_run_s and "course-msg-ok" in d.message.value
        assert f"predicted {plan.seconds:.1f} s" in text(d.message.value)
        checks.append((batch, plan.seconds, d.last_run_s, d.last_hook.count, plan.steps))
    for _batch, predicted, took, count, steps in checks:
        # Within 2x either way: the sleep dominates each step, but the rounds of alternation
        # follow a wall-clock budget and the memory step's profiler is CPU-bound, so a machine
        # loaded by other work (CI beside other jobs) moves both; 0.75-1.33x failed there once
        # (1.78 s predicted, 3.15 s taken). A plan that ignored the steps or the batch would be
        # off by far more than 2x.
        assert 0.5 <= predicted / took <= 2.0, checks
        # the fixed steps are counted exactly; the rounds of alternation follow the budget
        assert abs(count - steps) <= max(1, d.last_plan.rounds // 2), checks


def test_a_run_predicted_too_slow_is_refused_until_forced(quick_chart):
    fake = FakeCompare()
    d = Dashboard(size="smoke", hw=AVX2, compare_fn=fake, background=False, slow_limit_s=5.0,
                  clock=StepClock())
    d.n_layers.value, d.batch_size.value, d.seq_len.value = 16, 64, 256
    d.clock.record(d.current_config(), 1.0)  # as if calibrated: one second per step
    d.update_preview()
    plan = d.plan()
    assert plan.seconds > 5.0
    assert "refused" in text(d.preview.value) and plan.describe() in text(d.preview.value)
    d.run_button.click()
    msg = text(d.message.value)
    assert "not run" in msg and f"would take {plan.describe()}" in msg and fake.calls == []
    d.force.value = True
    d.run_button.click()
    assert fake.labels == [["fp32"]] and "ran anyway" in text(d.message.value)


def test_stop_ends_a_run_between_steps(quick_chart):
    d = Dashboard(size="smoke", hw=AVX2, background=False)
    d.checkpoint.value = "full"
    d.run()  # calibrated, one row pair in the history
    rows = len(d.history)

    def stop_on_third(model, optimizer, scaler, micro_batches, dtype=None, max_grad_norm=1.0):
        out = train_step(model, optimizer, scaler, micro_batches, dtype, max_grad_norm)
        if d.last_hook.count == 2:  # this is the third step: Stop is pressed during it
            d.stop_button.click()
        return out
    d.step_fn = stop_on_third
    d.run_button.click()
    assert d.last_hook.count == 3  # the third step finished, no fourth one started
    assert "Stopped" in d.message.value and len(d.history) == rows
    assert d.progress_label.value == "stopped after 3 step(s)"
    assert not d.run_button.disabled and d.stop_button.disabled


def test_the_progress_bar_moves_and_stop_works_from_another_thread(quick_chart):
    """As in a kernel: the click returns at once, the Run goes on in a worker thread, the bar
    moves step by step, and Stop (pressed on this thread) ends the Run between two steps."""
    step = CostlyStep(1e-8)
    d = Dashboard(size="smoke", hw=AVX2, step_fn=step, budget_s=30.0, background=True)
    assert d.stop_button.layout.display != "none"
    values, threads = [], set()

    def seen(ch):
        values.append(ch["new"])
        threads.add(threading.current_thread())
    d.progress.observe(seen, names="value")
    d.checkpoint.value = "full"
    t0 = time.perf_counter()
    d.run_button.click()
    assert time.perf_counter() - t0 < 1.0 and d.run_button.disabled  # the click returned
    deadline = time.monotonic() + 60
    while d.progress.value < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert d.progress.value >= 6, "the progress bar did not move"
    assert re.fullmatch(r"step \d+ of ~\d+", d.progress_label.value)
    planned = d.last_plan.steps
    d.stop_button.click()
    assert d.wait(timeout=30)
    assert "Stopped" in d.message.value and d.history.empty
    assert d.last_hook.count <= values[-1] + 1 < planned  # no step after the one running
    moving = [v for v in values if v > 0]
    assert len(set(moving)) >= 6 and moving == sorted(moving)
    assert threading.main_thread() not in threads  # every update came from the worker thread


def test_a_synchronous_run_moves_the_bar_from_the_kernels_thread(quick_chart):
    """Where background updates do not render (Colab), a click runs the Run on the caller's
    thread: the click returns when it is done, the bar moved during the Run (each step sees
    the value the step before it set) and every update came from that thread; Stop is hidden."""
    d = Dashboard(size="smoke", hw=AVX2, background=False)
    assert d.stop_button.layout.display == "none" and "no Stop button" in text(d.header.value)
    d.run()  # calibrates fp32, so the next Run has a plan with its steps
    updates, during = [], []

    def seen(ch):
        updates.append((ch["new"], threading.current_thread()))
    d.progress.observe(seen, names="value")

    def step(model, optimizer, scaler, micro_batches, dtype=None, max_grad_norm=1.0):
        during.append((d.progress.value, threading.current_thread()))
        return train_step(model, optimizer, scaler, micro_batches, dtype, max_grad_norm)
    d.step_fn = step
    d.checkpoint.value = "full"
    d.run_button.click()
    assert len(d.history) == 3 and d.progress_label.value == "done"  # the click ran it all
    here = threading.current_thread()
    assert {t for _, t in updates} == {here} and {t for _, t in during} == {here}
    seen_by_steps = [v for v, _ in during]
    assert seen_by_steps == list(range(len(during))) and len(during) >= 6  # moved step by step
    moving = [v for v, _ in updates if v > 0]
    assert moving[:len(during)] == list(range(1, len(during) + 1))
    assert not d.run_button.disabled


def test_a_kernel_interrupt_stops_a_synchronous_run(quick_chart):
    """A synchronous Run has no Stop button: interrupting the kernel (KeyboardInterrupt in
    the callback) stops it, and the dashboard says so and stays usable."""
    d = Dashboard(size="smoke", hw=AVX2, background=False)
    d.run()
    rows = len(d.history)

    def interrupted(model, optimizer, scaler, micro_batches, dtype=None, max_grad_norm=1.0):
        if d.last_hook.count == 2:
            raise KeyboardInterrupt
        return train_step(model, optimizer, scaler, micro_batches, dtype, max_grad_norm)
    d.step_fn = interrupted
    d.checkpoint.value = "full"
    d.run_button.click()
    assert "interrupt" in text(d.message.value) and len(d.history) == rows
    assert d.progress_label.value == "stopped after 2 step(s)" and not d.run_button.disabled


def test_colab_runs_synchronously_unless_told_otherwise(monkeypatch):
    monkeypatch.delenv(W.MODE_ENV, raising=False)
    assert W.background_updates_render()[0] and Dashboard(size="smoke", hw=AVX2).background
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    renders, why = W.background_updates_render()
    assert not renders and "colabtools#3373" in why
    d = Dashboard(size="smoke", hw=AVX2)
    assert not d.background and d.stop_button.layout.display == "none"
    assert "Colab" in text(d.header.value)
    assert Dashboard(size="smoke", hw=AVX2, background=True).background  # the argument wins
    monkeypatch.setenv(W.MODE_ENV, "thread")  # then the environment variable
    d = Dashboard(size="smoke", hw=AVX2)
    assert d.background and d.stop_button.layout.display != "none"
    monkeypatch.delitem(sys.modules, "google.colab")
    monkeypatch.setenv(W.MODE_ENV, "sync")
    assert not Dashboard(size="smoke", hw=AVX2).background
    monkeypatch.setenv(W.MODE_ENV, "later")
    with pytest.raises(ValueError, match="COURSE_DASHBOARD"):
        Dashboard(size="smoke", hw=AVX2)


def test_memory_stays_flat_over_50_runs(quick_chart):
    """Every Run builds two models and measures them; nothing of them may stay alive (the
    saved-tensor meter once kept whole autograd graphs): live tensor bytes after 50 Runs equal
    those after the first few."""
    def live_tensor_bytes():
        gc.collect()
        seen = {}
        for o in gc.get_objects():
            if issubclass(type(o), torch.Tensor) and o.device.type == "cpu":
                try:
                    st = o.untyped_storage()
                    seen[st.data_ptr()] = st.nbytes()
                except RuntimeError:  # a FakeTensor that torch.compile keeps (another test's): no memory
                    continue
        return sum(seen.values())

    d = Dashboard(size="smoke", hw=AVX2, background=False, budget_s=0.01)
    d.n_layers.value, d.batch_size.value, d.seq_len.value = 1, 1, 8
    d.checkpoint.value = "full"
    model_bytes = estimate(d.current_config()).parameters
    for _ in range(3):
        d.run()
    before = live_tensor_bytes()
    for _ in range(47):
        d.run()
    after = live_tensor_bytes()
    assert len(d.history) == 100 and (d.history["status"] == "ok").all()
    assert after - before < model_bytes / 4, (before, after)


def test_a_run_over_the_containers_memory_limit_is_refused_not_killed(tmp_path, monkeypatch):
    """On a hub with a memory limit below the host's free RAM, a Run whose estimated peak
    does not fit under the limit is refused with a message (the kernel would be OOM-killed)."""
    (tmp_path / "meminfo").write_text(f"MemAvailable: {64 * GiB // 1024} kB\n")
    (tmp_path / "self").write_text("0::/\n")
    (tmp_path / "cg").mkdir()
    (tmp_path / "cg" / "memory.max").write_text(str(GiB))
    (tmp_path / "cg" / "memory.current").write_text(str(GiB - 30 * MiB))
    for name, path in (("MEMINFO", "meminfo"), ("CGROUP_ROOT", "cg"), ("PROC_CGROUP", "self")):
        monkeypatch.setattr(guard, name, str(tmp_path / path))
    fake = FakeCompare()
    d = Dashboard(size="smoke", hw=AVX2, compare_fn=fake, background=False)
    d.batch_size.value = 64  # estimated peak ~27 MiB: more than 80% of the 30 MiB left
    assert estimate(d.current_config()).peak_allocated > 0.8 * 30 * MiB
    assert "refused" in text(d.preview.value)
    d.run_button.click()
    msg = html.unescape(text(d.message.value))
    assert "not run:" in msg and "container's memory limit (cgroup v2: 1.00 GiB" in msg
    assert re.search(r"batch \d+ fits by the estimate", msg)
    assert fake.calls == [] and d.history.empty and not d.run_button.disabled
    d.batch_size.value = 4  # fits: the Run goes ahead
    d.clock = seeded_clock(*run_configs(d.current_config(), AVX2))
    d.run_button.click()
    assert len(fake.calls) == 1 and len(d.history) == 1


def test_on_mps_the_dashboard_says_that_peaks_are_measured_on_the_cpu(quick_chart):
    """MPS has no peak-memory counter: `memory_step` takes the peak on the CPU
    (tests/test_measure.py), and the dashboard says so before and after a Run."""
    mps = HardwareInfo(device="mps", name="Apple M2 (test)", native_bf16=True, fp16_fast=True)
    fake = FakeCompare()
    d = Dashboard(size="smoke", hw=mps, compare_fn=fake, background=False)
    d.clock = seeded_clock(*run_configs(d.current_config(), mps))
    assert "peak is measured by one step" in text(d.preview.value)
    d.run_button.click()
    assert len(fake.calls) == 1
    assert "note: MPS has no peak-memory counter: the peak is measured" in text(d.message.value)


def test_policy_that_does_not_fit_is_a_message_not_a_traceback(quick_chart):
    fake = FakeCompare()
    d = Dashboard(size="smoke", hw=AVX2, compare_fn=fake, background=False,
                  clock=seeded_clock(config_for("smoke")))
    d.n_layers.value = 2
    d.checkpoint.value = "segments:9"
    assert "does not fit" in d.preview.value and "course-msg-error" in d.preview.value
    d.run_button.click()
    assert "invalid settings" in d.message.value and "does not fit" in d.message.value
    assert fake.calls == [] and d.history.empty and not d.run_button.disabled
    d.checkpoint.value = "nonsense"
    d.run_button.click()
    assert "unknown policy" in d.message.value and fake.calls == []
    d.n_layers.value = 8
    assert "every-4" in d.checkpoint.options and "segments:3" in d.checkpoint.options
    d.checkpoint.value = "every-4"
    d.n_layers.value = 3
    assert "every-4" not in d.checkpoint.options and "does not fit" in d.preview.value
    d.n_layers.value = 4
    d.run_button.click()
    assert fake.labels == [["fp32", "fp32+every-4"]]


def test_fp16_on_a_cpu_is_refused_at_the_cpu_size_until_forced(quick_chart):
    fake = FakeCompare()
    cpu = config_for("cpu")
    d = Dashboard(size="cpu", hw=AVX2, compare_fn=fake, background=False,
                  clock=seeded_clock(cpu, cpu.replace(precision="fp16")))
    d.precision.value = "fp16"
    assert "refused" in d.preview.value and "emulated" in d.preview.value
    d.run_button.click()
    assert "not run" in d.message.value and "emulated" in d.message.value
    assert "run anyway" in d.message.value
    assert fake.calls == [] and d.progress_label.value == "not run"
    d.force.value = True
    d.run_button.click()
    assert fake.calls == [[(cpu, True), (cpu.replace(precision="fp16"), True)]]
    assert "ran anyway" in d.message.value


def test_bf16_on_a_t4_is_refused_and_fp16_recommended(quick_chart):
    fake = FakeCompare()
    t4 = config_for("t4", device="cuda")
    d = Dashboard(size="t4", device="cuda", hw=T4, compare_fn=fake, background=False,
                  clock=seeded_clock(t4.replace(precision="fp16"), t4.replace(precision="bf16")))
    d.precision.value = "bf16"
    d.run_button.click()
    assert "emulated" in d.message.value and "not run" in d.message.value and fake.calls == []
    d.precision.value = "fp16"
    d.run_button.click()
    assert fake.labels == [["fp16"]]


def test_oom_is_reported_with_suggestions_and_the_dashboard_keeps_working(quick_chart):
    """Big batches run out of memory (the step raises torch's OutOfMemoryError, as on a GPU);
    small ones are measured for real."""
    def step_or_oom(model, optimizer, scaler, micro_batches, dtype=None, max_grad_norm=1.0):
        if micro_batches[0][0].shape[0] >= 64:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return train_step(model, optimizer, scaler, micro_batches, dtype, max_grad_norm)
    d = Dashboard(size="smoke", hw=AVX2, step_fn=step_or_oom, background=False)
    d.precision.value = "bf16"
    d.batch_size.value = 64  # the first Run's calibration already runs out of memory
    assert d.run() is None
    assert d.history["status"].tolist() == ["OOM", "OOM"]
    msg = text(d.message.value)
    assert "ran out of memory" in msg and "course-msg-error" in d.message.value
    assert "Smaller variants" in msg and "estimated peak" in msg and "still works" in msg
    assert not d.run_button.disabled and quick_chart == [2]  # OOM rows are drawn as such

    d.batch_size.value = 4
    d.run_button.click()
    assert d.history["status"].tolist()[-2:] == ["ok", "ok"]
    d.batch_size.value = 64  # calibrated now: compare itself meets the out-of-memory error
    d.run_button.click()
    assert d.history["status"].tolist()[-2:] == ["OOM", "OOM"]
    assert "ran out of memory" in text(d.message.value)
    d.batch_size.value = 4
    d.run_button.click()
    assert d.history["status"].tolist()[-2:] == ["ok", "ok"]
    assert "course-msg-ok" in d.message.value and body_rows(d.table.value) == 8


def test_an_unexpected_error_becomes_a_message(quick_chart):
    def boom_when_checkpointed(model, optimizer, scaler, micro_batches, dtype=None,
                               max_grad_norm=1.0):
        if any(type(m).__name__ == "Checkpointed" for m in model.modules()):
            raise RuntimeError("boom from deep inside torch")
        return train_step(model, optimizer, scaler, micro_batches, dtype, max_grad_norm)
    d = Dashboard(size="smoke", hw=AVX2, step_fn=boom_when_checkpointed, background=False)
    d.run_button.click()
    d.checkpoint.value = "full"
    d.run_button.click()
    assert "RuntimeError: boom" in text(d.message.value) and "still works" in d.message.value
    assert d.history["status"].tolist() == ["ok", "error", "error"]
    d.checkpoint.value = "none"
    d.run_button.click()
    assert d.history["status"].tolist()[-1] == "ok" and "course-msg-ok" in d.message.value


def test_history_table_is_the_course_summary(quick_chart):
    fake = FakeCompare()
    d = Dashboard(size="smoke", hw=AVX2, compare_fn=fake, background=False,
                  clock=seeded_clock(config_for("smoke")))
    d.checkpoint.value = "full"
    d.run_button.click()
    t = history_table(d.history)
    assert t["config"].tolist() == ["fp32 (baseline)", "fp32 + full checkpointing"]
    assert {"#", "size", "step ms", "time vs baseline", "peak MiB", "est peak MiB",
            "saved MiB", "saved dtypes"} <= set(t.columns)
    assert t["time vs baseline"].tolist() == ["1.00x (reference)", "too small to time"]
    assert t["size"].tolist() == ["b4 s32 L2"] * 2


def test_calibration_is_capped_where_the_precision_is_emulated():
    cpu = config_for("cpu")
    assert calibration_config(cpu, AVX2) == cpu  # native fp32: the configuration itself
    cal = calibration_config(cpu.replace(precision="bf16"), AVX2)
    assert cal.batch_size < cpu.batch_size and effective_flops(cal) <= 6e9
    fp16 = calibration_config(cpu.replace(precision="fp16"), AVX2)
    assert effective_flops(fp16) <= 5e8
    assert effective_flops(cpu.replace(checkpoint="full")) > effective_flops(cpu)


def test_oom_suggestions_are_smaller_and_sorted():
    cfg = config_for("t4", device="cuda")
    sugg = oom_suggestions(cfg, T4)
    assert 1 <= len(sugg) <= 3
    peaks = [float(s.split("estimated peak ")[1].split(" MiB")[0].replace(",", "")) for s in sugg]
    assert peaks == sorted(peaks)
    now = estimate(cfg).peak_allocated / 2**20
    assert all(p < now for p in peaks)
    assert any("fp16" in s for s in sugg) and not any("bf16" in s for s in sugg)  # T4 recipe


def test_dashboard_chart_needs_rows():
    d = Dashboard(size="smoke", hw=AVX2)
    with pytest.raises(ValueError, match="at least one run"):
        dashboard_chart(d.history)


def test_bad_constructor_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="size"):
        Dashboard(size="huge")
    with pytest.raises(ValueError, match="budget_s"):
        Dashboard(size="smoke", budget_s=0)


def test_the_ipywidgets_line_under_test():
    """`make test` runs this file twice: with the venv's ipywidgets 8 and with Colab's 7.7 put
    in front of it (``COURSE_IPYWIDGETS`` names the line it expects)."""
    expected = os.environ.get("COURSE_IPYWIDGETS")
    assert int(ipywidgets.__version__.split(".")[0]) in (7, 8)
    if expected:
        assert ipywidgets.__version__.startswith(expected + "."), ipywidgets.__file__


def test_a_korean_kernel_gets_the_dashboard_in_korean(monkeypatch, quick_chart):
    """Issue 28: under COURSE_LANG=ko the controls, the preview, the progress, the message and
    the table's labels are Korean; the history keeps its English columns and values."""
    monkeypatch.setenv("COURSE_LANG", "ko")
    base = config_for("smoke")
    d = Dashboard(size="smoke", hw=AVX2, compare_fn=FakeCompare(), background=False,
                  clock=seeded_clock(base, base.replace(checkpoint="full")))
    assert (d.run_button.description, d.precision.description) == ("실행", "정밀도")
    assert "기준선: fp32 (여기서의 레시피, 체크포인팅 없음)" in text(d.preview.value)
    d.checkpoint.value = "full"
    d.run_button.click()
    msg = text(d.message.value)
    assert "과(와) 기준선 fp32 의 비교(#1: 여기서의 레시피" in msg and "최대 메모리" in msg
    assert "against its baseline" not in msg and d.progress_label.value == "완료"
    assert "기준선 대비 시간" in d.table.value and "(기준선)" in d.table.value
    assert d.history["time_verdict"].tolist()[-1] in ("faster", "slower", "within noise",
                                                      "too small to time", "too few rounds")
