"""The live dashboard's widget: pick a precision, a checkpoint policy and a size, press Run.

Over 400 lines because it is one class, `Dashboard`, whose controls, callbacks and Run share its
widget state. Each Run compares the chosen configuration with its baseline (`course_utils.dashboard.run`);
a Run predicted above ``slow_limit_s`` is refused unless "run anyway" is ticked. A Run happens
on a worker thread (the bar moves, Stop works) except where widget updates sent from a thread do
not render (Colab): there it happens on the kernel's thread and Stop is hidden
(`background_updates_render`). Works with ipywidgets 7.7 (Colab's) and 8.x.
"""
from __future__ import annotations

import html
import io
import os
import sys
import threading
import time

import ipywidgets as widgets
import pandas as pd
from IPython.display import display

from ..checkpointing import MODES
from ..config import RunConfig, config_for, size_profile
from ..experiments import compare
from ..guard import check_feasible
from ..hardware import HardwareInfo, detect, recommend_precision
from ..i18n import tr
from ..measure import out_of_memory_message, ran_out_of_memory
from ..memory_model import estimate
from ..plots import dashboard_chart
from ..step_timing import default_budget_s
from ..terms import GiB
from ..training import train_step
from .report import (
    box,
    dtype_text,
    first_line,
    header_html,
    preview_message,
    result_message,
    table_html,
)
from .run import StepClock, StepHook, Stopped, plan_run, run_configs

__all__ = ("SLOW_LIMIT_S", "MODE_ENV", "Dashboard", "background_updates_render", "dashboard",
           "policy_options")

#: A Run predicted to take longer than this many seconds is refused unless "run anyway".
SLOW_LIMIT_S = 60.0

#: Environment variable that chooses where a Run happens: ``thread`` (a worker thread, Stop
#: shown) or ``sync`` (the kernel's thread, Stop hidden); unset: `background_updates_render`.
MODE_ENV = "COURSE_DASHBOARD"

# Columns every history has (a Run that failed as a whole has no measured ones).
_COLUMNS = ("run", "click", "label", "baseline", "baseline_run", "status", "precision",
            "checkpoint", "batch_size", "seq_len", "n_layers", "grad_accum_steps", "step_time_s",
            "paired_step_time_s", "tokens_per_s", "time_ratio", "time_verdict", "emulated",
            "parameters", "gradients",
            "optimizer_state", "activations", "autocast_weight_copies", "logits",
            "peak_allocated", "est_peak_allocated", "peak_ratio", "saved_total",
            "est_saved_total", "saved_ratio", "saved_dtypes", "oom", "error")


def background_updates_render() -> tuple[bool, str]:
    """``(renders, reason)``: whether widget updates sent from a worker thread reach the page here,
    and why: ``$COURSE_DASHBOARD`` when set (``thread``: yes, ``sync``: no), else no on Colab
    (``google.colab`` imported; googlecolab/colabtools#3373) and yes elsewhere. Raises ValueError
    for a ``$COURSE_DASHBOARD`` that is neither."""
    env = os.environ.get(MODE_ENV, "").strip().lower()
    if env:
        if env not in ("thread", "sync"):
            raise ValueError(tr("{variable}={value!r}: expected 'thread' (Run on a worker thread) "
                                "or 'sync' (Run on the kernel's thread).", variable=MODE_ENV,
                                value=env))
        return env == "thread", f"{MODE_ENV}={env}"
    if "google.colab" in sys.modules:
        return False, tr("Colab shows no widget updates sent from a background thread "
                         "(googlecolab/colabtools#3373)")
    return True, tr("this front end shows widget updates sent from a background thread")


def policy_options(n_layers: int) -> list[str]:
    """Checkpoint policies that fit a model of ``n_layers`` blocks, for the policy box."""
    opts = ["none", "full", "selective"] + [f"every-{k}" for k in (2, 3, 4) if k <= n_layers]
    return opts + [f"segments:{n}" for n in sorted({2, max(1, round(n_layers ** 0.5))})
                   if 1 < n <= n_layers]


class Dashboard:
    """The live dashboard: controls, Run and Stop buttons, a progress bar, a history table and
    a chart.

    Args:
        size: size profile of the defaults (default `course_utils.config.size_profile()`).
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``mps`` (default: this machine's best).
        hw: the `HardwareInfo` behind the recipe, the baseline and the refusals (default: detected).
        budget_s: seconds of alternating timed steps per Run (default
            `course_utils.step_timing.default_budget_s` of the size).
        slow_limit_s: refuse Runs predicted to take longer (seconds) unless "run anyway".
        step_fn, compare_fn: the training step and the comparison (`train_step`, `compare`).
        background: True runs each Run on a worker thread; False synchronously on the
            caller's thread, Stop hidden; None (default) asks `background_updates_render`.
        clock: a `course_utils.dashboard.run.StepClock` (default: a new one).

    Results: ``history``, ``measurements``, ``last_plan``, ``last_run_s`` (seconds of the last
    Run after calibration), ``last_hook``, ``mode_reason`` (why a Run happens where it does).

    Raises:
        ValueError: an unknown size profile, a device this machine lacks, a non-positive budget,
            a ``$COURSE_DASHBOARD`` other than ``thread`` or ``sync``."""

    def __init__(self, size: str | None = None, *, device: str | None = None,
                 hw: HardwareInfo | None = None, budget_s: float | None = None,
                 slow_limit_s: float = SLOW_LIMIT_S, step_fn=train_step, compare_fn=compare,
                 background: bool | None = None, clock: StepClock | None = None):
        if budget_s is not None and not budget_s > 0:
            raise ValueError(tr("budget_s must be > 0 seconds, got {budget_s!r}.",
                                budget_s=budget_s))
        self.size = size or size_profile()
        self.base = config_for(self.size, **({"device": device} if device else {}))
        self.hw = hw or detect(self.base.device)
        self.recipe = recommend_precision(self.hw)
        self.budget_s = budget_s or default_budget_s(self.size)
        self.slow_limit_s, self.step_fn, self.compare_fn = slow_limit_s, step_fn, compare_fn
        if background is None:
            background, self.mode_reason = background_updates_render()
        else:
            self.mode_reason = tr("background={background} was passed", background=background)
        self.background, self.clock = bool(background), clock or StepClock()
        self.measurements: list = []
        self._rows: list[dict] = []
        self._stop, self._thread = threading.Event(), None
        self.last_plan = self.last_run_s = self.last_hook = None
        self._build()
        self.update_preview()

    def _build(self) -> None:
        style, box = {"description_width": "initial"}, widgets.Layout(width="190px")

        def number(value, hi, name):
            return widgets.BoundedIntText(value=value, min=1, max=hi, description=name,
                                          style=style, layout=box)
        self.precision = widgets.Dropdown(
            options=[("fp32", "fp32"), (tr("bf16 autocast"), "bf16"),
                     (tr("fp16 autocast + GradScaler"), "fp16")], value=self.recipe.precision,
            description=tr("precision"), style=style, layout=widgets.Layout(width="290px"))
        self.checkpoint = widgets.Combobox(
            value="none", options=policy_options(self.base.n_layers), ensure_option=False,
            description=tr("checkpoint"), placeholder=", ".join(MODES), style=style,
            layout=widgets.Layout(width="260px"))
        self.batch_size = number(self.base.batch_size, 65536, tr("batch"))
        self.seq_len = number(self.base.seq_len, 1 << 20, tr("sequence"))
        self.n_layers = number(self.base.n_layers, 1024, tr("layers"))
        self.grad_accum_steps = number(self.base.grad_accum_steps, 1024, tr("accumulation"))
        self.compile = widgets.Checkbox(value=False, description="torch.compile", indent=False,
                                        layout=widgets.Layout(width="140px"))
        self.force = widgets.Checkbox(value=False, description=tr("run anyway (slow or refused)"),
                                      indent=False, layout=widgets.Layout(width="230px"))
        self.run_button = widgets.Button(description=tr("Run"), button_style="primary",
                                         icon="play",
                                         tooltip=tr("measure this configuration and its baseline"))
        self.stop_button = widgets.Button(description=tr("Stop"), icon="stop", disabled=True,
                                          tooltip=tr("stop the Run after the current step"))
        self.clear_button = widgets.Button(description=tr("Clear history"), icon="trash")
        self.progress = widgets.IntProgress(value=0, min=0, max=1,
                                            layout=widgets.Layout(width="160px"))
        self.progress_label = widgets.Label(value="")
        self.preview, self.message = widgets.HTML(), widgets.HTML()
        self.table = widgets.HTML(value=f"<i>{tr('No runs yet: press Run.')}</i>")
        self.chart = widgets.Image(format="png", layout=widgets.Layout(display="none",
                                                                       max_width="100%"))
        self.header = header = widgets.HTML(header_html(self.hw, self.size, self.base, self.recipe,
                                                        self.budget_s,
                                                        None if self.background
                                                        else self.mode_reason))
        if not self.background:  # the kernel handles no click while a Run holds its thread
            self.stop_button.layout.display = "none"
        self.widget = widgets.VBox([
            header, widgets.HBox([self.precision, self.checkpoint, self.compile]),
            widgets.HBox([self.batch_size, self.seq_len, self.n_layers, self.grad_accum_steps]),
            widgets.HBox([self.run_button, self.stop_button, self.progress, self.progress_label,
                          self.force, self.clear_button]),
            self.preview, self.message, self.table, self.chart])
        self.widget.add_class("course-dashboard")
        controls = ("precision", "checkpoint", "batch_size", "seq_len", "n_layers",
                    "grad_accum_steps", "compile", "force")
        for name in controls + ("run_button", "stop_button", "clear_button", "progress",
                                "progress_label", "preview", "message", "table", "chart"):
            getattr(self, name).add_class("course-" + name.replace("_", "-"))  # CSS hooks
        for name in controls:
            getattr(self, name).observe(self._on_change, names="value")
        self.run_button.on_click(lambda _: self.start())
        self.stop_button.on_click(lambda _: self.stop())
        self.clear_button.on_click(lambda _: self.clear())

    def _ipython_display_(self, **kwargs):
        """Display the layout (ipywidgets 7 has no ``_repr_mimebundle_``)."""
        display(self.widget)

    def current_config(self) -> RunConfig:
        """The `RunConfig` the controls describe; raises ValueError (RunConfig's) for an invalid one."""
        return self.base.replace(
            precision=self.precision.value, checkpoint=self.checkpoint.value.strip() or "none",
            batch_size=int(self.batch_size.value), seq_len=int(self.seq_len.value),
            n_layers=int(self.n_layers.value), grad_accum_steps=int(self.grad_accum_steps.value),
            compile=bool(self.compile.value))

    @property
    def history(self) -> pd.DataFrame:
        """One row per measured configuration, each Run's baseline first: `compare`'s columns
        (ratios to that Run's baseline) plus ``run`` (row number), ``click`` (Run number),
        ``baseline``, ``baseline_run``, ``status`` (``ok``/``OOM``/``error``), ``saved_dtypes``."""
        df = pd.DataFrame(self._rows)
        return df.assign(**{col: None for col in _COLUMNS if col not in df.columns})

    def plan(self, config: RunConfig | None = None):
        """The `course_utils.dashboard.run.RunPlan` of a Run of ``config`` (default: the
        controls'): configurations, steps and predicted seconds."""
        config = config or self.current_config()
        return plan_run(run_configs(config, self.hw), self.clock, self.hw, self.budget_s)

    def assess(self, config: RunConfig) -> tuple[list[str], list[str]]:
        """``(problems, notes)`` of a Run of ``config``: problems refuse it unless "run anyway"
        (`check_feasible`: emulated precisions that would take minutes, memory; a predicted
        duration above ``slow_limit_s``), notes are shown with it."""
        problems, notes = [], []
        for cfg in run_configs(config, self.hw):
            try:
                notes += check_feasible(cfg, self.hw)
            except ValueError as e:
                problems.append(str(e))
        est = estimate(config).peak_allocated
        if self.hw.device == "cuda" and self.hw.total_memory_bytes and \
                est > self.hw.total_memory_bytes:
            notes.append(tr("estimated peak {peak:.1f} GiB exceeds this GPU's {total:.1f} GiB: "
                            "expect an out-of-memory error.", peak=est / GiB,
                            total=self.hw.total_memory_bytes / GiB))
        plan = self.plan(config)
        if plan.seconds is not None and plan.seconds > self.slow_limit_s:
            problems.append(tr("this Run would take {plan}, more than {limit:.0f} s. Lower batch, "
                               "sequence or layers.", plan=plan.describe(),
                               limit=self.slow_limit_s))
        return problems, list(dict.fromkeys(notes))

    def _on_change(self, change=None) -> None:
        if change is not None and change.get("owner") is self.n_layers:
            self.checkpoint.options = policy_options(int(self.n_layers.value))
        self.update_preview()

    def update_preview(self) -> None:
        """Describe the Run the controls set up (``preview.value``): the configuration, its
        baseline, the predicted duration, and any reason it would be refused."""
        try:
            cfg = self.current_config()
        except ValueError as e:
            self.preview.value = box("error", [f"<b>{tr('invalid settings')}:</b> "
                                               f"{html.escape(str(e))}"])
            return
        problems, notes = self.assess(cfg)
        self.preview.value = preview_message(cfg, run_configs(cfg, self.hw), self.plan(cfg),
                                             problems, notes, bool(self.force.value),
                                             self.slow_limit_s)

    def clear(self) -> None:
        """Forget all runs (the calibrated step times are kept)."""
        self._rows.clear()
        self.measurements.clear()
        self.table.value = f"<i>{tr('No runs yet: press Run.')}</i>"
        self.chart.layout.display = "none"
        self.chart.value = b""
        self.message.value = self.progress_label.value = ""
        self.progress.value = 0
        self.update_preview()

    def start(self) -> None:
        """The Run button: `run` on a worker thread (``background``), else here, on the
        caller's thread (in a kernel: the kernel's), returning when the Run is done."""
        if self._thread is not None and self._thread.is_alive():
            return
        if self.background:
            self._thread = threading.Thread(target=self.run, name="course-dashboard-run", daemon=True)
            self._thread.start()
        else:
            self.run()

    def stop(self) -> None:
        """The Stop button: end the Run before its next training step."""
        self._stop.set()
        self.progress_label.value = tr("stopping after this step...")

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a background Run; True when none is running any more."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self._thread is None or not self._thread.is_alive()

    def _stage(self, value: int | None, text: str, style: str = "info") -> None:
        if value is not None:
            self.progress.value = min(value, self.progress.max)
        self.progress.bar_style = style
        self.progress_label.value = text

    def run(self):
        """One Run, here and now: validate, calibrate, refuse what is too slow, compare with the
        baseline, update history, table, chart and message. Never raises: invalid settings, refusals,
        failures, a Stop and a kernel interrupt become messages. Returns the `Measurement` of the
        chosen configuration, or None when nothing was measured."""
        self._stop.clear()
        self.run_button.disabled, self.stop_button.disabled = True, False
        self.message.value = ""
        try:
            return self._run()
        except (Stopped, KeyboardInterrupt) as e:
            self._stage(None, tr("stopped after {n} step(s)",
                                 n=self.last_hook.count if self.last_hook else 0), "warning")
            stopped = f"<b>{tr('Stopped')}</b>"
            how = (tr("{stopped} between two steps", stopped=stopped) if isinstance(e, Stopped)
                   else tr("{stopped} by the kernel's interrupt", stopped=stopped))
            self.message.value = box("warn", [
                tr("{how}: nothing was added to the history (a Run reports only comparisons it "
                   "finished).", how=how), tr("Change a setting and press Run.")])
        except Exception as e:  # noqa: BLE001 - a callback must never leave a traceback
            self._stage(None, tr("failed"), "danger")
            self.message.value = box("error", [
                f"<b>{tr('the run failed')}:</b> {html.escape(first_line(e))}",
                tr("The dashboard still works: change a setting and press Run again.")])
        finally:
            self.run_button.disabled, self.stop_button.disabled = False, True
            self.update_preview()
        return None

    def _hook(self, configs=()) -> StepHook:
        def on_step(n):
            if n >= self.progress.max > 1:  # more steps than planned: keep the bar moving
                self.progress.max = n + 1
            total = self.progress.max
            self._stage(n, tr("step {n} of ~{total}", n=n, total=total) if total > 1
                        else tr("step {n}", n=n))
        self.last_hook = StepHook(self.step_fn, self._stop, on_step, configs)
        return self.last_hook

    def _run(self):
        try:
            config = self.current_config()
        except ValueError as e:
            self._stage(0, tr("not run"))
            self.message.value = box("error", [f"<b>{tr('invalid settings')}:</b> "
                                               f"{html.escape(str(e))}"])
            return None
        configs, force = run_configs(config, self.hw), bool(self.force.value)
        problems, notes = self.assess(config)
        self.last_plan, self.last_run_s, df, error = None, None, None, None
        t0 = time.perf_counter()
        try:
            if not problems and self._calibrate(configs):
                problems, notes = self.assess(config)
                self.update_preview()  # now with the predicted seconds
            if problems and not force:
                self._stage(0, tr("not run"))
                self.message.value = box("error", [f"<b>{tr('not run')}:</b> {html.escape(p)}"
                                                    for p in problems]
                                          + [tr("Change the settings, or tick {run_anyway}.",
                                                run_anyway=f"<i>{tr('run anyway')}</i>")])
                return None
            plan = self.last_plan = self.plan(config)
            # value first: ipywidgets 7 clamps the last Run's full bar to a lower max (a flash)
            self.progress.value = 0
            self.progress.max = max(1, plan.steps)
            self._stage(0, tr("step {n} of ~{total}", n=0, total=plan.steps))
            hook, t0 = self._hook(configs), time.perf_counter()
            df = self.compare_fn(list(configs), budget_s=self.budget_s, step_fn=hook,
                                 hw=self.hw, force=force, progress=False)
        except Stopped:
            raise
        except Exception as e:  # noqa: BLE001 - OOM, or e.g. torch.compile without a compiler
            oom = ran_out_of_memory(e)  # in the course's words, as compare's rows say it
            error = (oom, out_of_memory_message(config, self.hw.name, e) if oom else first_line(e))
        rows = self._append(configs, df, self.last_hook, error)
        t1 = time.perf_counter()
        self._stage(None, tr("drawing..."))
        self._render()
        self.clock.render_s = time.perf_counter() - t1
        self.last_run_s = time.perf_counter() - t0
        self._stage(self.progress.max, tr("done"), "success")
        self.message.value = result_message(
            configs, rows, self.hw, notes, problems if force else [],
            self.last_run_s, self.last_plan.seconds if self.last_plan else None)
        return self.measurements[-1] if df is not None else None

    def _calibrate(self, configs) -> bool:
        """Calibrate the step time of each configuration the clock cannot predict yet."""
        done = False
        for cfg in configs:
            if self.clock.step_s(cfg, self.hw) is None:
                self.progress.max, done = 1, True
                self._stage(0, tr("calibrating {precision}: one short step...",
                                  precision=cfg.precision))
                self.clock.calibrate(cfg, self.hw, self._hook())
        return done

    def _append(self, configs, df, hook: StepHook, error) -> list[dict]:
        if df is not None:
            self.measurements += df.attrs.get("measurements", [])
            df.attrs = {}  # pandas deep-copies attrs on every row access: drop them first
            records = df.to_dict("records")
        else:
            oom, text = error
            records = [{"label": c.label, **{k: v for k, v in c.as_dict().items() if k != "seed"},
                        "oom": oom, "error": text,
                        "est_peak_allocated": estimate(c).peak_allocated} for c in configs]
        first, click = len(self._rows) + 1, 1 + max([r["click"] for r in self._rows], default=0)
        for i, (cfg, rec) in enumerate(zip(configs, records)):
            status = "OOM" if rec.get("oom") else ("error" if rec.get("error") else "ok")
            rec.update(run=first + i, click=click, baseline=i == 0, baseline_run=first,
                       status=status, saved_dtypes=dtype_text(hook.dtypes.get(cfg) if hook
                                                               else None))
            self._rows.append(rec)
            if status == "ok" and rec.get("step_time_s"):
                self.clock.record(cfg, rec["step_time_s"])
        return records

    def _render(self) -> None:
        df = self.history
        self.table.value = table_html(df)
        buf = io.BytesIO()
        dashboard_chart(df, size=self.size).savefig(buf, format="png", dpi=80)
        self.chart.value = buf.getvalue()
        self.chart.layout.display = ""


def dashboard(size: str | None = None, **kwargs) -> Dashboard:
    """The live dashboard (`Dashboard` of ``size`` and ``kwargs``); as the last expression of a cell
    it displays itself. Raises ValueError for an unknown size profile or a device this machine lacks."""
    return Dashboard(size, **kwargs)
