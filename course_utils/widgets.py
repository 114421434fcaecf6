"""The live dashboard of lesson 03: pick a precision, a checkpoint policy and a size, press Run.

``dashboard()`` shows the controls; each Run measures the chosen configuration with
`course_utils.measure.measure` (short timing budget: a few steps), appends it to a history
table and redraws a chart of step time and memory breakdown against the fp32 baseline of the
same size (measured automatically the first time a size is run). Invalid or very slow
combinations get a clear message instead of a traceback, and an out-of-memory error is shown
with suggestions while the dashboard keeps working.

Everything a callback produces lands in widget values (``HTML.value``, ``Image.value``), so
tests can click ``Run`` and read the results without a kernel::

    d = Dashboard(size="smoke")
    d.precision.value = "bf16"
    d.run_button.click()
    d.history          # one row per measurement, pandas
    d.message.value    # what the learner reads
"""
from __future__ import annotations

import html
import io
import os
import time

import ipywidgets as widgets
import pandas as pd

from .checkpointing import MODES
from .config import GiB, MiB, RunConfig, config_for, size_profile, step_flops
from .hardware import HardwareInfo, check_feasible, detect, recommend_precision
from .measure import MEMORY_FIELDS, Measurement, measure
from .memory_model import estimate

__all__ = ["Dashboard", "dashboard", "baseline_config", "policy_options", "history_table",
           "oom_suggestions", "DEFAULT_STEPS", "DEFAULT_WARMUP", "SLOW_LIMIT_S"]


#: Timed steps per Run (median of these), and warm-up steps before them: a short budget so
#: that a Run click answers in seconds at the `cpu` size profile.
DEFAULT_STEPS = 3
DEFAULT_WARMUP = 1

#: A Run predicted to take longer than this many seconds (from the speed of an earlier run)
#: is refused unless "run anyway" is ticked.
SLOW_LIMIT_S = 60.0

#: On a CPU (no out-of-memory error to catch: the kernel would be killed), refuse a run whose
#: estimated peak exceeds this fraction of the machine's RAM.
_CPU_RAM_FRACTION = 0.7

#: Steps of a `measure()` call in units of one training step: setup forward, gradient pass,
#: profiled step (about 3) + warm-up + timed steps. Used to predict a run's duration.
_FIXED_STEP_EQUIVALENTS = 3

#: The columns of `Dashboard.history`, in order.
HISTORY_COLUMNS = (["run", "label", "baseline", "status", "precision", "checkpoint", "compile",
                    "batch_size", "seq_len", "n_layers", "d_model", "grad_accum_steps", "device",
                    "step_time_s", "tokens_per_s"] + list(MEMORY_FIELDS)
                   + ["saved_total", "est_peak_allocated", "time_ratio", "peak_ratio",
                      "saved_ratio", "baseline_run", "error", "notes"])


def baseline_config(config: RunConfig) -> RunConfig:
    """The fp32 baseline of ``config``: same size, device and accumulation, fp32, no
    checkpointing, no compile."""
    return config.replace(precision="fp32", checkpoint="none", compile=False)


def policy_options(n_layers: int) -> list[str]:
    """Checkpoint policies that fit a model of ``n_layers`` blocks, for the policy box."""
    opts = ["none", "full", "selective"]
    for k in (2, 3, 4):
        if k <= n_layers:
            opts.append(f"every-{k}")
    for n in sorted({2, max(1, round(n_layers ** 0.5))}):
        if 1 < n <= n_layers:
            opts.append(f"segments:{n}")
    return opts


def oom_suggestions(config: RunConfig, hw: HardwareInfo | None = None, limit: int = 3) -> list[str]:
    """Smaller variants of ``config`` with their estimated peak memory, smallest first.

    Each entry reads like ``"bf16 + checkpoint 'full': estimated peak 310 MiB (now 1210 MiB)"``.
    The estimates come from `course_utils.memory_model.estimate`. With ``hw`` on CUDA, the low
    precision is the one `recommend_precision` picks (fp16 on a T4, bf16 on an A100).
    """
    low = "bf16"
    if hw is not None:
        rec = recommend_precision(hw).precision
        low = rec if rec != "fp32" else ("fp16" if hw.device == "cuda" else "bf16")
    now = estimate(config).peak_allocated
    candidates = {
        f"{low} autocast": config.replace(precision=low),
        "checkpoint 'full'": config.replace(checkpoint="full"),
        f"{low} + checkpoint 'full'": config.replace(precision=low, checkpoint="full"),
    }
    if config.batch_size > 1:
        half = max(1, config.batch_size // 2)
        accum = config.grad_accum_steps * 2
        candidates[f"batch {half} x accumulation {accum} (same effective batch)"] = \
            config.replace(batch_size=half, grad_accum_steps=accum)
    if config.seq_len > 16:
        candidates[f"sequence {config.seq_len // 2}"] = config.replace(seq_len=config.seq_len // 2)
    rows, seen = [], {config}
    for name, cfg in candidates.items():
        if cfg in seen:
            continue
        seen.add(cfg)
        peak = estimate(cfg).peak_allocated
        if peak < now:
            rows.append((peak, f"{name}: estimated peak {peak / MiB:,.0f} MiB "
                               f"(now {now / MiB:,.0f} MiB)"))
    rows.sort()
    return [text for _, text in rows[:limit]]


def _fmt(v, scale=1.0, digits=1):
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return None
    return round(v / scale, digits)


def history_table(df: pd.DataFrame) -> pd.DataFrame:
    """A readable view of `Dashboard.history`: milliseconds, MiB and ratios to the fp32 baseline.

    ``time x`` and ``peak x`` are each run's value divided by its fp32 baseline's (same size).
    """
    out = pd.DataFrame({"run": df["run"], "config": df["label"] + df["baseline"].map(
        {True: " (baseline)", False: ""})})
    out["batch"] = df["batch_size"]
    out["seq"] = df["seq_len"]
    out["layers"] = df["n_layers"]
    out["accum"] = df["grad_accum_steps"]
    out["step ms"] = [_fmt(v, 1e-3) for v in df["step_time_s"]]
    out["time x"] = [_fmt(v, 1, 2) for v in df["time_ratio"]]
    out["tokens/s"] = [None if v is None or pd.isna(v) else int(v) for v in df["tokens_per_s"]]
    out["peak MiB"] = [_fmt(v, MiB) for v in df["peak_allocated"]]
    out["peak x"] = [_fmt(v, 1, 2) for v in df["peak_ratio"]]
    out["est. peak MiB"] = [_fmt(v, MiB) for v in df["est_peak_allocated"]]
    out["saved MiB"] = [_fmt(v, MiB) for v in df["saved_total"]]
    out["saved x"] = [_fmt(v, 1, 2) for v in df["saved_ratio"]]
    out["status"] = df["status"]
    return out


def _physical_memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):  # not a POSIX system
        return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else 'no message'}"


_TABLE_STYLE = ("<style>.course-history th, .course-history td {text-align: right; "
                "padding: 1px 6px; line-height: 1.3;} .course-history td {white-space: nowrap;} "
                ".course-history td:nth-child(2), .course-history th:nth-child(2) "
                "{text-align: left;}</style>")


def _box(kind: str, lines: list[str]) -> str:
    colors = {"ok": ("#1b5e20", "#e8f5e9"), "info": ("#0d47a1", "#e3f2fd"),
              "warn": ("#7a4f01", "#fff8e1"), "error": ("#b71c1c", "#ffebee")}
    fg, bg = colors[kind]
    body = "<br>".join(lines)
    return (f'<div class="course-msg course-msg-{kind}" style="color:{fg};background:{bg};'
            f'padding:6px 10px;border-radius:4px;line-height:1.4">{body}</div>')


class Dashboard:
    """The live dashboard: controls, a Run button with progress, a history table and a chart.

    Args:
        size: size profile for the defaults (``smoke``, ``cpu``, ``t4``, ``a100``, ``h100``);
            default `course_utils.config.size_profile()` (``$COURSE_SIZE`` or the hardware).
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``mps`` (default: this machine's best).
        hw: the `HardwareInfo` used for recommendations and feasibility checks (default:
            detected for the device; tests pass a fake T4 here).
        steps: timed steps per measurement (median of them).
        warmup: warm-up optimizer steps before timing.
        slow_limit_s: refuse runs predicted to take longer (seconds) unless "run anyway".
        measure_fn: the measuring function (default `course_utils.measure.measure`).

    Attributes (widgets): ``precision``, ``checkpoint``, ``batch_size``, ``seq_len``,
    ``n_layers``, ``compile``, ``grad_accum_steps``, ``force``, ``run_button``,
    ``clear_button``, ``progress``, ``progress_label``, ``preview``, ``message``, ``table``,
    ``chart``, and ``widget`` (the whole layout). Results: ``records`` (list of dicts),
    ``history`` (DataFrame), ``measurements`` (`Measurement` objects), ``last_run_s``.

    Raises:
        ValueError: an unknown size profile or a device this machine lacks.
    """

    def __init__(self, size: str | None = None, *, device: str | None = None,
                 hw: HardwareInfo | None = None, steps: int = DEFAULT_STEPS,
                 warmup: int = DEFAULT_WARMUP, slow_limit_s: float = SLOW_LIMIT_S,
                 measure_fn=None):
        if steps < 1 or warmup < 0:
            raise ValueError(f"steps must be >= 1 and warmup >= 0, got steps={steps}, "
                             f"warmup={warmup}.")
        self.size = size or size_profile()
        self.base = config_for(self.size, **({"device": device} if device else {}))
        self.hw = hw or detect(self.base.device)
        self.steps, self.warmup, self.slow_limit_s = steps, warmup, slow_limit_s
        self.measure_fn = measure_fn
        self.records: list[dict] = []
        self.measurements: list[Measurement] = []
        self.last_run_s: float | None = None
        self._t0 = time.perf_counter()
        rec = recommend_precision(self.hw)

        style = {"description_width": "initial"}
        box = widgets.Layout(width="190px")
        self.precision = widgets.Dropdown(
            options=[("fp32", "fp32"), ("bf16 autocast", "bf16"),
                     ("fp16 autocast + GradScaler", "fp16")],
            value=rec.precision, description="precision", style=style,
            layout=widgets.Layout(width="290px"))
        self.checkpoint = widgets.Combobox(
            value="none", options=policy_options(self.base.n_layers), ensure_option=False,
            description="checkpoint", placeholder=", ".join(MODES), style=style,
            layout=widgets.Layout(width="260px"))
        self.batch_size = widgets.BoundedIntText(value=self.base.batch_size, min=1, max=65536,
                                                 description="batch", style=style, layout=box)
        self.seq_len = widgets.BoundedIntText(value=self.base.seq_len, min=1, max=1 << 20,
                                              description="sequence", style=style, layout=box)
        self.n_layers = widgets.BoundedIntText(value=self.base.n_layers, min=1, max=1024,
                                               description="layers", style=style, layout=box)
        self.grad_accum_steps = widgets.BoundedIntText(value=self.base.grad_accum_steps, min=1,
                                                       max=1024, description="accumulation",
                                                       style=style, layout=box)
        self.compile = widgets.Checkbox(value=False, description="torch.compile", indent=False,
                                        layout=widgets.Layout(width="140px"))
        self.force = widgets.Checkbox(value=False, description="run anyway (slow or refused)",
                                      indent=False, layout=widgets.Layout(width="230px"))
        self.run_button = widgets.Button(description="Run", button_style="primary", icon="play",
                                         tooltip="measure this configuration (and its fp32 "
                                                 "baseline if the history has none)")
        self.clear_button = widgets.Button(description="Clear history", icon="trash")
        self.progress = widgets.IntProgress(value=0, min=0, max=1, bar_style="",
                                            layout=widgets.Layout(width="160px"))
        self.progress_label = widgets.Label(value="")
        self.preview = widgets.HTML()
        self.message = widgets.HTML()
        self.table = widgets.HTML(value="<i>No runs yet: press Run.</i>")
        self.chart = widgets.Image(format="png", layout=widgets.Layout(display="none",
                                                                       max_width="100%"))
        header = widgets.HTML(
            f"<b>{html.escape(self.hw.name)}</b> ({self.hw.device}), size profile "
            f"<code>{self.size}</code>: d_model {self.base.d_model}, {self.base.n_heads} heads. "
            f"Recommended recipe here: <b>{rec.precision}</b>"
            f"{' + GradScaler' if rec.grad_scaler else ''}. Each Run times {steps} steps "
            f"after {warmup} warm-up step(s).")
        self.widget = widgets.VBox([
            header,
            widgets.HBox([self.precision, self.checkpoint, self.compile]),
            widgets.HBox([self.batch_size, self.seq_len, self.n_layers, self.grad_accum_steps]),
            widgets.HBox([self.run_button, self.progress, self.progress_label, self.force,
                          self.clear_button]),
            self.preview, self.message, self.table, self.chart,
        ])
        self.widget.add_class("course-dashboard")

        for w in (self.precision, self.checkpoint, self.batch_size, self.seq_len,
                  self.n_layers, self.grad_accum_steps, self.compile, self.force):
            w.observe(self._on_change, names="value")
        self.run_button.on_click(lambda _: self.run())
        self.clear_button.on_click(lambda _: self.clear())
        self.update_preview()

    # ------------------------------------------------------------------ display
    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    # ------------------------------------------------------------------ state
    def current_config(self) -> RunConfig:
        """The `RunConfig` the controls describe.

        Raises:
            ValueError: an invalid combination (e.g. a checkpoint policy that does not fit the
                number of layers), with RunConfig's message.
        """
        return self.base.replace(
            precision=self.precision.value, checkpoint=self.checkpoint.value.strip() or "none",
            batch_size=int(self.batch_size.value), seq_len=int(self.seq_len.value),
            n_layers=int(self.n_layers.value), grad_accum_steps=int(self.grad_accum_steps.value),
            compile=bool(self.compile.value))

    @property
    def history(self) -> pd.DataFrame:
        """One row per measurement (baselines included): config, status (``ok``, ``OOM``,
        ``error``), measured bytes and seconds, the estimated peak, ratios to the fp32
        baseline of the same size."""
        return pd.DataFrame(self.records, columns=HISTORY_COLUMNS)

    def _find_baseline(self, cfg: RunConfig) -> dict | None:
        for row in reversed(self.records):
            if row["config"] == cfg and row["status"] in ("ok", "OOM"):
                return row
        return None

    def _predicted_seconds(self, config: RunConfig) -> float | None:
        """Seconds one measurement of ``config`` should take, from the FLOP rate of the last
        successful run with the same precision, compile setting and device (None if none)."""
        for row in reversed(self.records):
            cfg = row["config"]
            if (row["status"] == "ok" and row["step_time_s"] and cfg.precision == config.precision
                    and cfg.compile == config.compile and cfg.device == config.device):
                rate = step_flops(cfg) / row["step_time_s"]
                per_step = step_flops(config) / rate
                return per_step * (self.steps + self.warmup + _FIXED_STEP_EQUIVALENTS)
        return None

    def assess(self, config: RunConfig) -> tuple[list[str], list[str]]:
        """Refusals and notes for ``config`` on this dashboard's hardware.

        Returns:
            ``(problems, notes)``: problems stop a Run unless "run anyway" is ticked (from
            `check_feasible`, a run predicted to exceed ``slow_limit_s``, or an estimated peak
            above 70% of a CPU machine's RAM); notes are shown with the result.
        """
        problems, notes = [], []
        try:
            notes += check_feasible(config, self.hw)
        except ValueError as e:
            problems.append(str(e))
            notes += [n for n in check_feasible(config, self.hw, force=True) if n not in str(e)]
        est = estimate(config)
        if self.hw.device == "cpu":
            ram = _physical_memory_bytes()
            if ram and est.peak_allocated > _CPU_RAM_FRACTION * ram:
                problems.append(
                    f"estimated peak {est.peak_allocated / GiB:.1f} GiB is more than "
                    f"{_CPU_RAM_FRACTION:.0%} of this machine's {ram / GiB:.1f} GiB of RAM; a CPU "
                    "run has no out-of-memory error to catch (the kernel would be killed). "
                    "Lower batch, sequence or layers.")
        elif self.hw.total_memory_bytes and est.peak_allocated > self.hw.total_memory_bytes:
            notes.append(f"estimated peak {est.peak_allocated / GiB:.1f} GiB exceeds this GPU's "
                         f"{self.hw.total_memory_bytes / GiB:.1f} GiB: expect an out-of-memory "
                         "error.")
        total = self._predicted_seconds(config)
        base = baseline_config(config)
        if total is not None and self._find_baseline(base) is None and base != config:
            total += self._predicted_seconds(base) or 0.0
        if total is not None and total > self.slow_limit_s:
            problems.append(f"this Run would take about {total:,.0f} s (predicted from the speed "
                            f"of your earlier runs), more than {self.slow_limit_s:.0f} s. Lower "
                            "batch, sequence or layers.")
        return problems, notes

    # ------------------------------------------------------------------ callbacks
    def _on_change(self, change=None) -> None:
        if change is not None and change.get("owner") is self.n_layers:
            self.checkpoint.options = policy_options(int(self.n_layers.value))
        self.update_preview()

    def update_preview(self) -> None:
        """Describe the configuration the controls show: size, tokens per step, estimated peak,
        and any reason it would be refused (written to ``preview.value``)."""
        try:
            cfg = self.current_config()
        except ValueError as e:
            self.preview.value = _box("error", [f"<b>invalid settings:</b> {html.escape(str(e))}"])
            return
        est = estimate(cfg)
        line = (f"<b>{html.escape(cfg.label)}</b>: {cfg.n_layers} layers x d_model {cfg.d_model}, "
                f"batch {cfg.batch_size} x sequence {cfg.seq_len} x accumulation "
                f"{cfg.grad_accum_steps} = {cfg.tokens_per_step:,} tokens per step; estimated peak "
                f"{est.peak_allocated / MiB:,.1f} MiB, saved tensors {est.saved_total / MiB:,.1f} "
                "MiB (analytic model).")
        lines = [line]
        base = baseline_config(cfg)
        if base != cfg and self._find_baseline(base) is None:
            lines.append("No fp32 baseline of this size yet: Run measures it first.")
        problems, notes = self.assess(cfg)
        kind = "info"
        if problems:
            kind = "warn"
            lines += [f"<b>{'runs anyway' if self.force.value else 'refused'}:</b> "
                      f"{html.escape(p)}" for p in problems]
            if not self.force.value:
                lines.append("Change the settings, or tick <i>run anyway</i>.")
        lines += [f"note: {html.escape(n)}" for n in notes]
        self.preview.value = _box(kind, lines)

    def clear(self) -> None:
        """Forget all runs (the next Run measures its fp32 baseline again)."""
        self.records.clear()
        self.measurements.clear()
        self.table.value = "<i>No runs yet: press Run.</i>"
        self.chart.layout.display = "none"
        self.chart.value = b""
        self.message.value = ""
        self.progress.value = 0
        self.progress_label.value = ""
        self.update_preview()

    def run(self) -> Measurement | None:
        """The Run button: validate, measure the fp32 baseline if needed, measure, update the
        history table, the chart and ``message.value``.

        Never raises: invalid settings, refused combinations, out-of-memory errors and failed
        runs become messages, and the dashboard stays usable.

        Returns:
            The `Measurement` of the chosen configuration, or None when nothing was measured.
        """
        self._t0 = time.perf_counter()
        self.run_button.disabled = True
        try:
            return self._run()
        except Exception as e:  # a callback must never leave a traceback in the dashboard
            self._stage(None, "failed")
            self.message.value = _box("error", [
                f"<b>the run failed:</b> {html.escape(_first_line(e))}",
                "The dashboard still works: change a setting and press Run again."])
            return None
        finally:
            self.last_run_s = time.perf_counter() - self._t0
            self.run_button.disabled = False
            self.update_preview()

    def _stage(self, value: int | None, text: str) -> None:
        if value is not None:
            self.progress.value = value
        self.progress.bar_style = {"done": "success", "failed": "danger"}.get(text, "info")
        self.progress_label.value = text

    def _measure(self, config: RunConfig, force: bool) -> Measurement:
        fn = self.measure_fn or measure
        try:
            return fn(config, steps=self.steps, warmup=self.warmup, force=force)
        except ValueError:
            raise
        except MemoryError as e:
            return Measurement(config=config, device_name=self.hw.name, oom=True,
                               error=f"out of memory: {_first_line(e)}")
        except Exception as e:  # e.g. torch.compile without a C++ compiler
            text = _first_line(e)
            oom = "out of memory" in text.lower() or "can't allocate memory" in text.lower()
            return Measurement(config=config, device_name=self.hw.name, oom=oom, error=text)

    def _append(self, m: Measurement, baseline: dict | None, is_baseline: bool) -> dict:
        c = m.config
        row = {k: None for k in HISTORY_COLUMNS}
        row.update(m.as_row())
        row.update(run=len(self.records) + 1, baseline=is_baseline,
                   status="OOM" if m.oom else ("error" if m.error else "ok"),
                   est_peak_allocated=estimate(c).peak_allocated, config=c,
                   baseline_run=baseline["run"] if baseline else None)
        if is_baseline and row["status"] == "ok":
            baseline = row  # a baseline's ratios to itself: 1.0
        if baseline is not None and baseline["status"] == "ok" and row["status"] == "ok":
            for col, name in (("step_time_s", "time_ratio"), ("peak_allocated", "peak_ratio"),
                              ("saved_total", "saved_ratio")):
                if row[col] is not None and baseline[col]:
                    row[name] = row[col] / baseline[col]
        self.records.append(row)
        self.measurements.append(m)
        return row

    def _run(self) -> Measurement | None:
        self.message.value = ""
        try:
            config = self.current_config()
        except ValueError as e:
            self._stage(0, "not run")
            self.message.value = _box("error", [f"<b>invalid settings:</b> {html.escape(str(e))}"])
            return None
        problems, notes = self.assess(config)
        force = bool(self.force.value)
        if problems and not force:
            self._stage(0, "not run")
            self.message.value = _box("error", [f"<b>not run:</b> {html.escape(p)}"
                                                for p in problems]
                                      + ["Change the settings, or tick <i>run anyway</i>."])
            return None

        base_cfg = baseline_config(config)
        baseline = self._find_baseline(base_cfg)
        need_baseline = baseline is None
        self.progress.max = 3 if need_baseline and base_cfg != config else 2
        self.progress.value = 0
        done = 0
        if need_baseline:
            self._stage(0, f"measuring the fp32 baseline ({base_cfg.batch_size} x "
                           f"{base_cfg.seq_len}, {base_cfg.n_layers} layers)...")
            bm = self._measure(base_cfg, force=False)
            baseline = self._append(bm, None, is_baseline=True)
            done += 1
            if base_cfg == config:
                m, row = bm, baseline
        if not (need_baseline and base_cfg == config):
            self._stage(done, f"measuring {config.label}...")
            m = self._measure(config, force=force)
            row = self._append(m, baseline, is_baseline=False)
            done += 1
        self._stage(done, "drawing...")
        self._render()
        self._stage(self.progress.max, "done")
        self.message.value = self._result_message(m, row, baseline, notes, problems,
                                                  measured_baseline=need_baseline)
        return m

    def _render(self) -> None:
        from .plots import dashboard_chart
        df = self.history
        self.table.value = (_TABLE_STYLE + '<div style="overflow-x:auto">' + history_table(df)
                            .to_html(index=False, na_rep="-", border=0, classes="course-history",
                                     float_format=lambda v: f"{v:,.2f}") + "</div>")
        fig = dashboard_chart(df)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=80)
        self.chart.value = buf.getvalue()
        self.chart.layout.display = ""

    def _result_message(self, m: Measurement, row: dict, baseline: dict, notes: list[str],
                        problems: list[str], measured_baseline: bool) -> str:
        lines, kind = [], "ok"
        if m.oom or m.error:
            kind = "error"
            what = "ran out of memory" if m.oom else "failed"
            lines.append(f"<b>{html.escape(m.config.label)} {what}</b> (run #{row['run']}): "
                         f"{html.escape(m.error or '')}")
            if m.oom:
                sugg = oom_suggestions(m.config, self.hw)
                if sugg:
                    lines.append("Smaller variants, by the analytic model: "
                                 + "; ".join(html.escape(s) for s in sugg) + ".")
            lines.append("The dashboard still works: change a setting and press Run again.")
        else:
            parts = [f"<b>{html.escape(m.config.label)}</b> (run #{row['run']}): step "
                     f"{m.step_time_s * 1e3:,.1f} ms" if m.step_time_s else
                     f"<b>{html.escape(m.config.label)}</b> (run #{row['run']})"]
            if row["time_ratio"] is not None and row["run"] != baseline["run"]:
                parts.append(f"{row['time_ratio']:.2f}x the fp32 baseline's time")
            if m.peak_allocated is not None:
                peak = f"peak {m.peak_allocated / MiB:,.1f} MiB"
                if row["peak_ratio"] is not None and row["run"] != baseline["run"]:
                    peak += f" ({row['peak_ratio']:.2f}x the baseline)"
                parts.append(peak)
            if m.saved_total is not None:
                parts.append(f"saved tensors {m.saved_total / MiB:,.1f} MiB")
            lines.append(", ".join(parts) + ".")
            if baseline["status"] == "OOM" and row["run"] != baseline["run"]:
                lines.append("The fp32 baseline of this size ran out of memory; this "
                             "configuration fits.")
        lines += [f"ran anyway: {html.escape(p)}" for p in problems]
        lines += [f"note: {html.escape(n)}" for n in list(dict.fromkeys(notes + m.notes))]
        took = time.perf_counter() - self._t0
        lines.append(f"This Run took {took:.1f} s"
                     + (" (fp32 baseline included)." if measured_baseline else "."))
        return _box(kind, lines)


def dashboard(size: str | None = None, **kwargs) -> Dashboard:
    """Show the live dashboard (the one line of lesson 03's dashboard cell).

    Args:
        size: size profile for the default settings (default: ``$COURSE_SIZE`` or chosen from
            the hardware, as everywhere in the course).
        **kwargs: passed to `Dashboard` (``device``, ``steps``, ``warmup``, ...).

    Returns:
        The `Dashboard`; as the last expression of a cell it displays itself.

    Raises:
        ValueError: an unknown size profile or a device this machine lacks.
    """
    return Dashboard(size, **kwargs)
