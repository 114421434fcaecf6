"""One Run of the live dashboard (`course_utils.dashboard`): what it runs (`run_configs`: the
configuration and its baseline, through `course_utils.experiments.compare`), how long it will
take (`plan_run`, from a `StepClock`'s step times), and the step hook that shows its progress and
stops it between steps (`StepHook`).
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..checkpointing import parse_policy
from ..config import RunConfig, step_flops
from ..hardware import HardwareInfo, is_emulated, recommend_precision
from ..i18n import tr
from ..measure import memory_step, prepare
from ..saved_tensors import SavedTensorMeter
from ..step_timing import MIN_ROUNDS, steps_for_budget, time_step
from ..terms import autocast_dtype, short_dtype
from ..training import setup, train_step

__all__ = ("COMPILE_ALLOWANCE_S", "RESCALE_LIMIT", "RunPlan", "StepClock", "StepHook", "Stopped",
           "baseline_of", "calibration_config", "effective_flops", "plan_run", "run_configs")

#: A step time is scaled by FLOPs from a measurement at most this many times smaller or larger
#: (where a calibration can come closer).
RESCALE_LIMIT = 2.0

#: Seconds added for each compiled configuration: compile time is not predicted (measured on
#: the course's 2-core CPU under load: 11 s at the `smoke` size, 250 s at `cpu`).
COMPILE_ALLOWANCE_S = 60.0

# Extra forward work per policy, as a fraction of the step: the blocks' forward is recomputed in
# backward (about a third of a step's FLOPs); selective recomputes the other ops (measured
# 1.25-1.35x the step time of none at the `cpu` size on the course's CPU: not cheap there).
_RECOMPUTE = (("none", 0.0), ("selective", 0.25))
_FULL_RECOMPUTE = 1 / 3

# A calibration step has at most this many FLOPs: native, emulated bf16, emulated fp16 (a CPU's
# fp16 matmuls run two orders of magnitude slower than fp32; `hardware.matmul_probe` measures
# it): about a second on a slow laptop.
_CALIBRATION_FLOPS = (("native", 3e10), ("bf16", 6e9), ("fp16", 5e8))

# A model's first (warm-up) step in timed steps (measured 1.1-1.3 at the `cpu` size on the
# course's 2-core CPU), and the seconds of drawing the chart and table until a Run measures it.
_DEFAULT_WARMUP_FACTOR, _DEFAULT_RENDER_S = 1.2, 1.0


class Stopped(Exception):
    """The learner pressed Stop: the Run ended between two steps."""


def baseline_of(config: RunConfig, hw: HardwareInfo) -> RunConfig:
    """The baseline a Run compares ``config`` with: the recipe precision of ``hw``
    (`recommend_precision`), no checkpointing, no compile, all else the same."""
    return config.replace(precision=recommend_precision(hw).precision, checkpoint="none",
                          compile=False)


def run_configs(config: RunConfig, hw: HardwareInfo) -> tuple[RunConfig, ...]:
    """What a Run of ``config`` measures: its baseline first, then ``config`` (once if equal)."""
    base = baseline_of(config, hw)
    return (base,) if base == config else (base, config)


def effective_flops(config: RunConfig) -> float:
    """FLOPs of one training step (`course_utils.config.step_flops`) with the forward work that
    the checkpoint policy recomputes in backward."""
    policy = parse_policy(config.checkpoint, config.n_layers)
    extra = dict(_RECOMPUTE).get(policy.mode)
    if extra is None:
        extra = _FULL_RECOMPUTE * (1 - policy.arg if policy.mode == "memory-budget" else 1)
    return step_flops(config) * (1 + extra)


class StepHook:
    """A training step (`course_utils.training.train_step`'s signature) that raises `Stopped`
    before a step once ``stop`` is set and calls ``on_step(count)`` after each. The first step of
    each model runs inside a `SavedTensorMeter`: ``dtypes[config]`` gets its saved floating-point
    activations' bytes by dtype (models matched to ``configs`` by autocast dtype in the order
    they first step; compiled ones skipped). ``__wrapped__``: the step itself (`inspect.unwrap`).
    """

    def __init__(self, step_fn: Callable = train_step, stop: threading.Event | None = None,
                 on_step: Callable[[int], None] | None = None, configs=()):
        self.step_fn, self.stop = step_fn, stop or threading.Event()
        self.__wrapped__ = step_fn
        self.on_step = on_step
        self.count = 0
        self.dtypes: dict = {}
        self._pending = list(configs)
        self._seen: set = set()

    def _config_of(self, dtype):
        for i, cfg in enumerate(self._pending):
            if autocast_dtype(cfg.precision) == dtype:
                return self._pending.pop(i)
        return None

    def __call__(self, model, optimizer, scaler, micro_batches, dtype=None, max_grad_norm=1.0):
        if self.stop.is_set():
            raise Stopped()
        cfg = None
        if id(model) not in self._seen:
            self._seen.add(id(model))
            cfg = self._config_of(dtype)
        if cfg is not None and not cfg.compile:
            with SavedTensorMeter(model) as meter:
                out = self.step_fn(model, optimizer, scaler, micro_batches, dtype, max_grad_norm)
            acts: dict = {}
            for r in meter.records:
                if r["bucket"] == "activations" and r["dtype"].is_floating_point:
                    name = short_dtype(r["dtype"])
                    acts[name] = acts.get(name, 0) + r["nbytes"]
            self.dtypes[cfg] = acts
        else:
            out = self.step_fn(model, optimizer, scaler, micro_batches, dtype, max_grad_norm)
        self.count += 1
        if self.on_step is not None:
            self.on_step(self.count)
        return out


@dataclass(frozen=True)
class _Sample:
    config: RunConfig
    flops: float
    seconds: float


class StepClock:
    """Seconds per training step on this machine: calibrated (`calibrate`), then learned from
    every Run (`record`), predicted by `step_s`; a Run's fixed costs by `factor`."""

    def __init__(self):
        self._samples: list[_Sample] = []
        self.factors: dict = {}  # device -> {"memory_per_layer": s, "setup_per_param": s}
        self.render_s = _DEFAULT_RENDER_S

    def record(self, config: RunConfig, seconds: float) -> None:
        """Remember that one step of ``config`` took ``seconds`` (compiled runs are ignored:
        their steps say nothing about an uncompiled one)."""
        if config.compile or not seconds or not math.isfinite(seconds) or seconds <= 0:
            return
        self._samples.append(_Sample(config, effective_flops(config), float(seconds)))

    def _nearest(self, config: RunConfig) -> _Sample | None:
        """The latest sample of ``config`` itself, else the one nearest in FLOPs (the latest
        among equals) of the same device and precision."""
        key = config.device, config.precision
        same = [(i, s) for i, s in enumerate(self._samples)
                if (s.config.device, s.config.precision) == key]
        if not same:
            return None
        flops = effective_flops(config)
        return min(same, key=lambda p: (p[1].config != config,
                                        abs(math.log(p[1].flops / flops)), -p[0]))[1]

    def step_s(self, config: RunConfig, hw: HardwareInfo | None = None) -> float | None:
        """Predicted seconds of one training step of ``config``: the latest sample of it, else
        the nearest of the same device and precision scaled by `effective_flops` (compiled: the
        uncompiled step). None when nothing of this device and precision was measured yet, or
        (given ``hw``) when that sample is over `RESCALE_LIMIT` times away in FLOPs and a
        calibration could come closer (fixed per-step costs make a small step a poor guide)."""
        plain = config.replace(compile=False)
        near = self._nearest(plain)
        if near is None:
            return None
        if near.config == plain:
            return near.seconds
        flops = effective_flops(plain)
        gap = abs(math.log(near.flops / flops))
        if hw is not None and gap > math.log(RESCALE_LIMIT):
            cal = calibration_config(plain, hw)
            if abs(math.log(effective_flops(cal) / flops)) < gap - 0.1:
                return None
        return near.seconds * flops / near.flops

    def factor(self, device: str, name: str) -> float:
        """A Run's fixed costs on ``device``, measured by its first calibration: ``warmup``
        (a warm-up step in timed steps), ``memory_per_layer`` (seconds the profiler adds to
        the memory step, per block and micro-batch), ``setup_per_param`` (seconds)."""
        default = {"warmup": _DEFAULT_WARMUP_FACTOR, "memory_per_layer": 0.0,
                   "setup_per_param": 0.0}[name]
        return self.factors.get(device, {}).get(name, default)

    def calibrate(self, config: RunConfig, hw: HardwareInfo, hook: StepHook) -> RunConfig:
        """Time and record one step of `calibration_config` of ``config`` through ``hook`` (so
        Stop works); a device's first calibration also times a model's setup and a profiled
        memory step (`factor`). Returns the configuration timed."""
        cal = calibration_config(config, hw)
        state = prepare(cal, hw, hook)  # the warm-up also pays first-use costs (data, kernels)
        fixed = None
        if cal.device not in self.factors:
            t0 = time.perf_counter()
            setup(cal)
            setup_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            memory_step(state)
            fixed = (setup_s, time.perf_counter() - t0)
        step_s = time_step(state.step, cal.device)
        self.record(cal, step_s)
        if fixed is not None:
            ops = (cal.n_layers + 1) * cal.grad_accum_steps
            self.factors[cal.device] = {"setup_per_param": fixed[0] / cal.shape.n_parameters,
                                        "memory_per_layer": max(0.0, fixed[1] - step_s) / ops}
        return cal


def calibration_config(config: RunConfig, hw: HardwareInfo) -> RunConfig:
    """``config`` itself, or a smaller batch (then sequence, then fewer layers) of it whose
    step stays under the calibration FLOP cap of its precision here; never compiled."""
    cfg = config.replace(compile=False, grad_accum_steps=1)
    caps = dict(_CALIBRATION_FLOPS)
    cap = caps[cfg.precision] if is_emulated(hw, cfg.precision) else caps["native"]
    while effective_flops(cfg) > cap:
        if cfg.batch_size > 1:
            cfg = cfg.replace(batch_size=cfg.batch_size // 2)
        elif cfg.seq_len > 16:
            cfg = cfg.replace(seq_len=cfg.seq_len // 2)
        elif cfg.n_layers > 1:
            cfg = cfg.replace(n_layers=cfg.n_layers // 2, checkpoint="none")
        else:
            break
    return cfg


@dataclass(frozen=True)
class RunPlan:
    """What a Run of ``configs`` (baseline first) will do and how long it should take.

    Attributes:
        configs: the configurations compared, the baseline first.
        emulated: per configuration, whether its precision is emulated here.
        step_s: predicted seconds of one step of each (None where not calibrated yet).
        rounds: predicted rounds of alternation (None if nothing is timed natively).
        steps: training steps the Run performs (warm-up + memory + timed).
        seconds: predicted seconds of the whole Run (None until every precision is calibrated).
        compiled: configurations whose seconds include `COMPILE_ALLOWANCE_S`.
    """

    configs: tuple
    emulated: tuple
    step_s: tuple
    rounds: int | None
    steps: int
    seconds: float | None
    compiled: int = 0

    @property
    def uncalibrated(self) -> list:
        """Configurations whose step time is unknown (the Run calibrates them first)."""
        return [c for c, t in zip(self.configs, self.step_s) if t is None]

    def describe(self) -> str:
        """``"about 6 s: 2 configurations, ~24 training steps"`` and the like."""
        n = len(self.configs)
        what = (tr("{n} configuration, ~{steps} training steps", n=n, steps=self.steps) if n == 1
                else tr("{n} configurations, ~{steps} training steps", n=n, steps=self.steps))
        if self.seconds is None:
            return tr("time not known yet ({what})", what=what)
        if self.compiled:
            return tr("about {seconds:,.1f} s ({what}, including {allowance:.0f} s per "
                      "torch.compile (a rough allowance: compile time is not predicted))",
                      seconds=self.seconds, what=what, allowance=COMPILE_ALLOWANCE_S)
        return tr("about {seconds:,.1f} s ({what})", seconds=self.seconds, what=what)


def plan_run(configs, clock: StepClock, hw: HardwareInfo, budget_s: float) -> RunPlan:
    """The steps and predicted seconds of `compare`-ing ``configs`` with ``budget_s`` seconds
    of alternation: per configuration a warm-up and a profiled memory step, then the rounds that
    fit the budget (`course_utils.step_timing.steps_for_budget`)."""
    emulated = tuple(is_emulated(hw, c.precision) for c in configs)
    step_s = tuple(clock.step_s(c, hw) for c in configs)
    native = [t for t, e in zip(step_s, emulated) if not e]
    steps = 2 * len(configs)  # warm-up + memory step; an emulated one is timed on the latter
    rounds = None
    if native:
        rounds = MIN_ROUNDS if None in native else steps_for_budget(sum(native), budget_s, lo=MIN_ROUNDS)
        steps += rounds * len(native)
    if None in step_s:
        return RunPlan(tuple(configs), emulated, step_s, rounds, steps, None)
    seconds = clock.render_s
    for cfg, t, emu in zip(configs, step_s, emulated):
        dev = cfg.device
        seconds += clock.factor(dev, "setup_per_param") * cfg.shape.n_parameters
        if emu and hw.device == "cpu" and not cfg.compile:
            seconds += clock.step_s(cfg.replace(batch_size=1, seq_len=min(cfg.seq_len, 16),
                                                grad_accum_steps=1))
        else:
            seconds += t * clock.factor(dev, "warmup")
        seconds += t + clock.factor(dev, "memory_per_layer") * (cfg.n_layers + 1) \
            * cfg.grad_accum_steps
        seconds += COMPILE_ALLOWANCE_S if cfg.compile else 0.0
    if native:
        seconds += rounds * sum(native)
    return RunPlan(tuple(configs), emulated, step_s, rounds, steps, seconds,
                   sum(c.compile for c in configs))
