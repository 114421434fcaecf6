"""The live dashboard (course_utils.widgets) without a kernel: set controls, click Run, read the
history, the messages and the chart from widget values."""
import pandas as pd
import pytest

from course_utils import widgets as W
from course_utils.config import config_for, step_flops
from course_utils.hardware import HardwareInfo, detect, recommend_precision
from course_utils.measure import Measurement
from course_utils.memory_model import estimate
from course_utils.plots import dashboard_chart
from course_utils.widgets import Dashboard, baseline_config, dashboard, oom_suggestions

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CPU = HardwareInfo(device="cpu", name="Test CPU", native_bf16=True, fp16_fast=False,
                   cpu_features={"avx512_f": True, "avx512_bf16": True})
T4 = HardwareInfo(device="cuda", name="Tesla T4", compute_capability=(7, 5), native_bf16=False,
                  fp16_fast=True, total_memory_bytes=15 * 2**30, bf16_emulated=True)


class FakeMeasure:
    """Records calls; returns a Measurement whose bytes come from the analytic model and whose
    step time is proportional to the step's FLOPs (1e10 FLOP/s), or OOM / an exception."""

    def __init__(self, oom_if=lambda c: False, raise_if=lambda c: False):
        self.calls, self.oom_if, self.raise_if = [], oom_if, raise_if

    def __call__(self, config, steps=None, warmup=None, force=False, min_run_time=None):
        self.calls.append((config, force))
        if self.raise_if(config):
            raise RuntimeError("boom from deep inside torch")
        if self.oom_if(config):
            return Measurement(config=config, device_name="Fake GPU", oom=True,
                               error=f"out of memory on Fake GPU at batch {config.batch_size}. "
                                     "Try a smaller batch.")
        e = estimate(config)
        t = step_flops(config) / 1e10
        return Measurement(config=config, parameters=e.parameters, gradients=e.gradients,
                           optimizer_state=e.optimizer_state, activations=e.activations,
                           autocast_weight_copies=e.autocast_weight_copies, logits=e.logits,
                           peak_allocated=e.peak_allocated, step_time_s=t,
                           tokens_per_s=config.tokens_per_step / t, device_name="Fake")


def body_rows(html_table: str) -> int:
    return html_table.split("<tbody>")[1].count("<tr") if "<tbody>" in html_table else 0


def test_defaults_come_from_the_size_profile():
    d = dashboard()  # COURSE_SIZE=smoke (tests/conftest.py)
    base = config_for()
    assert (d.batch_size.value, d.seq_len.value, d.n_layers.value) == \
        (base.batch_size, base.seq_len, base.n_layers)
    assert d.grad_accum_steps.value == 1 and d.compile.value is False
    assert d.precision.value == recommend_precision(detect()).precision
    assert f"{base.batch_size * base.seq_len:,} tokens per step" in d.preview.value
    assert "No fp32 baseline" in d.preview.value or d.precision.value == "fp32"
    assert d.history.empty and body_rows(d.table.value) == 0
    bundle = d._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert Dashboard(size="cpu", hw=CPU).batch_size.value == config_for("cpu").batch_size


def test_run_measures_fp32_baseline_then_the_choice():
    """Real measurements at the smoke size: the baseline appears automatically, is reused, and
    full checkpointing saves fewer bytes than none."""
    d = Dashboard(size="smoke", hw=CPU)
    d.precision.value = "bf16"
    m = d.run()
    assert m is not None and m.config.precision == "bf16" and not m.oom
    h = d.history
    assert list(h["label"]) == ["fp32", "bf16"]
    assert list(h["baseline"]) == [True, False]
    assert list(h["status"]) == ["ok", "ok"]
    assert h["time_ratio"][1] == pytest.approx(h["step_time_s"][1] / h["step_time_s"][0])
    assert h["peak_ratio"][1] == pytest.approx(h["peak_allocated"][1] / h["peak_allocated"][0])
    assert h["time_ratio"][0] == 1.0
    assert body_rows(d.table.value) == 2
    assert bytes(d.chart.value).startswith(PNG_MAGIC) and d.chart.layout.display != "none"
    assert "run #2" in d.message.value and "fp32 baseline" in d.message.value
    assert "course-msg-ok" in d.message.value
    assert d.progress.value == d.progress.max and d.progress.bar_style == "success"
    assert not d.run_button.disabled

    d.checkpoint.value = "full"
    d.run_button.click()
    h = d.history
    assert list(h["label"]) == ["fp32", "bf16", "bf16+full"]  # no second baseline
    assert h["saved_total"][2] < h["saved_total"][1]
    assert h["baseline_run"][2] == 1
    assert body_rows(d.table.value) == 3


def test_baseline_is_per_size_and_reused():
    fake = FakeMeasure()
    d = Dashboard(size="smoke", hw=CPU, measure_fn=fake)
    d.precision.value = "bf16"
    d.run_button.click()
    assert [(c.label, c.batch_size) for c, _ in fake.calls] == [("fp32", 4), ("bf16", 4)]
    d.run_button.click()
    assert len(fake.calls) == 3  # baseline reused
    d.batch_size.value = 8
    assert "No fp32 baseline" in d.preview.value
    d.run_button.click()
    assert [(c.label, c.batch_size) for c, _ in fake.calls[3:]] == [("fp32", 8), ("bf16", 8)]
    assert d.history["baseline_run"].tolist()[-1] == 4
    d.precision.value = "fp32"
    d.run_button.click()  # the baseline itself, measured again, compared with the first one
    assert fake.calls[-1][0] == baseline_config(fake.calls[-1][0]) and len(fake.calls) == 6
    assert d.history["time_ratio"].iloc[-1] == pytest.approx(1.0)
    d.clear()
    assert d.history.empty and bytes(d.chart.value) == b"" and d.chart.layout.display == "none"
    d.precision.value = "bf16"
    d.run_button.click()
    assert [c.label for c, _ in fake.calls[6:]] == ["fp32", "bf16"]


def test_policy_that_does_not_fit_is_a_message_not_a_traceback():
    fake = FakeMeasure()
    d = Dashboard(size="smoke", hw=CPU, measure_fn=fake)
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
    assert "every-4" not in d.checkpoint.options
    assert "does not fit" in d.preview.value
    d.n_layers.value = 4
    d.precision.value = "bf16"
    d.run_button.click()
    assert d.history["label"].tolist() == ["fp32", "bf16+every-4"]


def test_fp16_on_a_cpu_is_refused_at_the_cpu_size_until_forced():
    fake = FakeMeasure()
    d = Dashboard(size="cpu", hw=CPU, measure_fn=fake)
    d.precision.value = "fp16"
    assert "refused" in d.preview.value and "emulated" in d.preview.value
    d.run_button.click()
    assert "not run" in d.message.value and "emulated" in d.message.value
    assert "run anyway" in d.message.value
    assert fake.calls == [] and d.progress_label.value == "not run"
    d.force.value = True
    d.run_button.click()
    assert [(c.precision, f) for c, f in fake.calls] == [("fp32", False), ("fp16", True)]
    assert "ran anyway" in d.message.value


def test_bf16_on_a_t4_is_refused_and_fp16_recommended():
    fake = FakeMeasure()
    d = Dashboard(size="t4", device="cuda", hw=T4, measure_fn=fake)
    assert d.precision.value == "fp16"  # the recipe for a T4
    d.precision.value = "bf16"
    d.run_button.click()
    assert "emulated" in d.message.value and "not run" in d.message.value
    assert fake.calls == []
    d.precision.value = "fp16"
    d.run_button.click()
    assert [c.precision for c, _ in fake.calls] == ["fp32", "fp16"]


def test_oom_is_reported_with_suggestions_and_the_dashboard_keeps_working(monkeypatch):
    """The dashboard's own measure function is patched: big batches run out of memory, small
    ones are measured for real."""
    real = W.measure
    calls = []

    def measure_or_oom(config, **kw):
        calls.append(config)
        if config.batch_size >= 64:
            return Measurement(config=config, device_name="Fake GPU", oom=True,
                               error=f"out of memory on Fake GPU at batch {config.batch_size}, "
                                     "seq 32: CUDA out of memory. Try a smaller batch or "
                                     "sequence, bf16/fp16, or a checkpoint policy such as 'full'.")
        return real(config, **kw)

    monkeypatch.setattr(W, "measure", measure_or_oom)
    d = Dashboard(size="smoke", hw=CPU)
    d.precision.value = "bf16"
    d.batch_size.value = 64
    assert d.run() is not None and d.measurements[-1].oom
    assert d.history["status"].tolist() == ["OOM", "OOM"]
    msg = d.message.value
    assert "ran out of memory" in msg and "course-msg-error" in msg
    assert "Smaller variants" in msg and "estimated peak" in msg
    assert "still works" in msg
    assert bytes(d.chart.value).startswith(PNG_MAGIC)  # OOM rows are drawn as such
    assert not d.run_button.disabled and d.progress.bar_style == "success"

    d.batch_size.value = 64  # the OOM'd baseline is not measured again...
    d.run_button.click()
    assert len(calls) == 3

    d.batch_size.value = 4  # ...and a size that fits just works afterwards
    d.run_button.click()
    h = d.history
    assert h["status"].tolist() == ["OOM", "OOM", "OOM", "ok", "ok"]
    assert h["time_ratio"].iloc[-1] == pytest.approx(h["step_time_s"].iloc[-1]
                                                     / h["step_time_s"].iloc[-2])
    assert "course-msg-ok" in d.message.value and body_rows(d.table.value) == 5


def test_baseline_oom_but_the_choice_fits():
    fake = FakeMeasure(oom_if=lambda c: c.precision == "fp32")
    d = Dashboard(size="smoke", hw=CPU, measure_fn=fake)
    d.precision.value = "bf16"
    d.checkpoint.value = "full"
    d.run_button.click()
    assert d.history["status"].tolist() == ["OOM", "ok"]
    assert "baseline of this size ran out of memory; this configuration fits" in d.message.value
    assert pd.isna(d.history["time_ratio"].iloc[-1])


def test_an_unexpected_error_becomes_a_message():
    fake = FakeMeasure(raise_if=lambda c: c.checkpoint == "full")
    d = Dashboard(size="smoke", hw=CPU, measure_fn=fake)
    d.checkpoint.value = "full"
    d.run_button.click()
    assert "RuntimeError: boom" in d.message.value and "still works" in d.message.value
    assert d.history["status"].tolist() == ["ok", "error"]
    d.checkpoint.value = "none"
    d.run_button.click()
    assert d.history["status"].tolist()[-1] == "ok" and "course-msg-ok" in d.message.value


def test_a_very_slow_or_too_big_run_is_refused_until_forced():
    fake = FakeMeasure()
    d = Dashboard(size="smoke", hw=CPU, measure_fn=fake, slow_limit_s=5.0)
    d.precision.value = "bf16"
    d.run_button.click()  # speed known now: 1e10 FLOP/s in the fake, for fp32 and bf16
    d.n_layers.value = 64
    d.batch_size.value = 256
    d.seq_len.value = 256
    cfg = d.current_config()
    predicted = step_flops(cfg) / 1e10 * (d.steps + d.warmup + W._FIXED_STEP_EQUIVALENTS)
    predicted += step_flops(baseline_config(cfg)) / 1e10 * (d.steps + d.warmup
                                                             + W._FIXED_STEP_EQUIVALENTS)
    assert predicted > 5.0
    n = len(fake.calls)
    d.run_button.click()
    assert f"about {predicted:,.0f} s" in d.message.value and len(fake.calls) == n
    d.force.value = True
    d.run_button.click()
    assert len(fake.calls) == n + 2

    d.force.value = False
    d.n_layers.value, d.batch_size.value, d.seq_len.value = 1024, 65536, 4096
    d.run_button.click()
    assert "RAM" in d.message.value and len(fake.calls) == n + 2


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
    d = Dashboard(size="smoke", hw=CPU)
    with pytest.raises(ValueError, match="at least one run"):
        dashboard_chart(d.history)


def test_bad_constructor_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="size"):
        Dashboard(size="huge")
    with pytest.raises(ValueError, match="steps"):
        Dashboard(size="smoke", steps=0)
