"""What the stack buys under a memory budget, and what it would need at scale.

Lesson 03's plumbing for three questions:

* **Largest batch under a memory budget** (`largest_batch`): for one configuration, the largest
  micro-batch whose *measured* peak allocated memory stays within a budget, found with a few
  measurements guided by the analytic estimate (`course_utils.memory_model.estimate`), and the
  tokens/s measured at that batch. On a CUDA GPU the budget is also enforced by the allocator
  (``torch.cuda.set_per_process_memory_fraction``): a batch that needs more raises an
  out-of-memory error, which is caught and counts as "does not fit". On a CPU nothing runs out
  of memory at these sizes, so the budget is applied to the measured peak (the profiler's).
* **A fair throughput comparison** (`interleaved_tokens_per_s`): configurations timed in
  alternation, step by step, so that a change in the machine's load hits all of them alike.
* **Memory at scale** (`GPTShape`, `SCALE_MODELS`, `estimate_at_scale`, `scale_table`): the
  byte counts of `course_utils.memory_model` applied to GPT-like shapes of 1B, 7B and 70B
  parameters with any vocabulary and sequence length. These are **estimates**, never
  measurements: nothing of that size runs here.

`committed_results` loads the GPU runs committed under ``results/*/bench.json`` (written by
``course-bench --out``), so that a learner on a CPU can compare with a GPU.
"""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from .checkpointing import plan_segments
from .config import PRECISIONS, GiB, MiB, RunConfig, check_dimensions
from .measure import Measurement, measure
from .memory_model import MemoryEstimate, estimate

__all__ = ["Probe", "BatchSearch", "largest_batch", "memory_budget", "interleaved_tokens_per_s",
           "GPTShape", "SCALE_MODELS", "SCALE_RECIPES", "estimate_at_scale", "scale_table",
           "committed_results", "GiB", "MiB"]



# --------------------------------------------------------------------------------------------
# Largest batch under a memory budget
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Probe:
    """One measured batch size of a `largest_batch` search.

    Attributes:
        batch_size: micro-batch (sequences).
        peak_allocated: measured peak allocated bytes of one training step (None after an
            out-of-memory error).
        estimated_peak: `memory_model.estimate`'s peak for the same configuration (bytes).
        fits: the step ran and its measured peak is at most the budget.
        oom: the step ran out of device memory (CUDA).
        step_time_s: median step time (seconds) of the timed steps, None if not timed.
        tokens_per_s: tokens per optimizer step / step time.
    """

    batch_size: int
    peak_allocated: int | None
    estimated_peak: int
    fits: bool
    oom: bool
    step_time_s: float | None
    tokens_per_s: float | None


@dataclass
class BatchSearch:
    """The result of `largest_batch` for one configuration.

    Attributes:
        config: the configuration searched (its ``batch_size`` is the one it started from).
        budget_bytes: the memory budget (bytes).
        batch_size: the largest micro-batch that fits (0 if not even 1 fits).
        measurement: the `Measurement` at ``batch_size`` (None if nothing fits).
        probes: every measured batch, in the order measured.
        method: how "fits" was decided on this device, in words.
        estimated: ``[(batch, estimated peak bytes), ...]`` for batches 1 .. the largest probed
            plus one (`memory_model.estimate`; for charts).
    """

    config: RunConfig
    budget_bytes: int
    batch_size: int
    measurement: Measurement | None
    probes: list = field(default_factory=list)
    method: str = ""
    estimated: list = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens/s measured at the largest fitting batch (None if nothing fits)."""
        return None if self.measurement is None else self.measurement.tokens_per_s

    @property
    def label(self) -> str:
        """The configuration's label without its batch (e.g. ``bf16+full``)."""
        return self.config.label

    def as_row(self) -> dict:
        """A flat dict for a table: label, largest batch, its peak (bytes), budget, time, tokens/s,
        number of measurements."""
        m = self.measurement
        return {"config": self.label, "largest batch": self.batch_size,
                "tokens/step": self.batch_size * self.config.seq_len * self.config.grad_accum_steps,
                "peak_allocated": None if m is None else m.peak_allocated,
                "budget_bytes": self.budget_bytes,
                "step_time_s": None if m is None else m.step_time_s,
                "tokens_per_s": self.tokens_per_s, "measurements": len(self.probes)}


def _device_kind(device: str) -> str:
    return torch.device(device).type


def memory_budget(fraction: float = 0.5, device: str = "cuda") -> int:
    """A memory budget in bytes: ``fraction`` of the GPU memory free right now.

    Reads ``torch.cuda.mem_get_info`` (free bytes as the driver sees them: other processes and
    this process's CUDA context are already subtracted).

    Raises:
        ValueError: ``fraction`` outside (0, 1], or ``device`` is not an available CUDA device
            (a CPU has no device memory to budget: apply a budget to a measured peak instead).
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}.")
    if _device_kind(device) != "cuda" or not torch.cuda.is_available():
        raise ValueError(f"memory_budget reads free GPU memory, and device {device!r} is not an "
                         "available CUDA device; on a CPU pass a budget in bytes (e.g. a "
                         "measured peak) to largest_batch instead.")
    free, _total = torch.cuda.mem_get_info(torch.device(device))
    return int(free * fraction)


def _predict_largest(config: RunConfig, budget: int, max_batch: int) -> int:
    """Largest b in 1..max_batch with estimate(b).peak <= budget (0 if none).

    The estimated peak never decreases with the batch (every activation term is proportional
    to it), so a bisection over b is exact."""
    def fits(b):
        return estimate(config.replace(batch_size=b)).peak_allocated <= budget
    if not fits(1):
        return 0
    lo, hi = 1, max_batch + 1  # fits(lo) is True; hi is past the range
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _estimated_slope(config: RunConfig) -> float:
    """Estimated bytes per extra sequence of the batch, where activations dominate the peak."""
    m = 4096
    return max(1.0, (estimate(config.replace(batch_size=2 * m)).peak_allocated
                     - estimate(config.replace(batch_size=m)).peak_allocated) / m)


def largest_batch(config: RunConfig, budget_bytes: int, max_batch: int = 1024, steps: int = 3,
                  warmup: int = 1, guided_probes: int = 4) -> BatchSearch:
    """The largest micro-batch of ``config`` whose measured step fits in ``budget_bytes``.

    Search (few measurements): the analytic estimate predicts the largest batch and that batch
    is measured with `course_utils.measure.measure` (memory and ``steps`` timed steps). Peak
    memory grows about linearly with the batch, so each next guess is a secant step from the
    measured peaks nearest the budget, never flatter than the estimate's bytes per sequence.
    The search stops when a fitting batch ``b`` and a non-fitting ``b + 1`` are both measured
    (or ``b == max_batch``). After ``guided_probes`` guided measurements it falls back to
    doubling (while no failing batch is known) and bisection, so it always ends. It typically
    takes two or three measurements.

    "Fits" means: no out-of-memory error and a measured peak allocated at most the budget.
    On CUDA the allocator is limited to the budget during the search
    (``torch.cuda.set_per_process_memory_fraction``, restored afterwards), so a batch that
    needs more raises and is caught by `measure`. On a CPU the budget is applied to the
    measured peak (parameters + optimizer state + the profiler's peak over one step).

    Args:
        config: the configuration (its ``batch_size`` is ignored; accumulation is kept).
        budget_bytes: memory budget in bytes (> 0).
        max_batch: the largest batch tried (>= 1).
        steps: timed steps per measurement (>= 1): tokens/s at the answer comes from these.
        warmup: optimizer steps before measuring (>= 1: AdamW's state must exist).
        guided_probes: estimate-guided measurements before doubling/bisection (>= 1).

    Returns:
        A `BatchSearch`; ``batch_size`` 0 if even a batch of 1 does not fit.

    Raises:
        ValueError: a non-positive budget, ``max_batch``, ``steps``, ``warmup`` or
            ``guided_probes``; a device without a peak-memory counter (MPS); a configuration
            `measure` refuses.
    """
    for name, v in (("budget_bytes", budget_bytes), ("max_batch", max_batch), ("steps", steps),
                    ("warmup", warmup), ("guided_probes", guided_probes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}.")
    kind = _device_kind(config.device)
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"largest_batch needs a peak-memory counter; device {config.device!r} "
                         "has none (use 'cpu' or 'cuda').")
    if kind == "cuda":
        dev = torch.device(config.device)
        total = torch.cuda.get_device_properties(dev).total_memory
        method = (f"CUDA: allocator limited to the budget ({budget_bytes / GiB:.2f} GiB of "
                  f"{total / GiB:.1f} GiB); a batch fits if its step raises no out-of-memory "
                  "error and max_memory_allocated <= budget")
    else:
        method = ("CPU: a batch fits if its measured peak (parameters + optimizer state + "
                  "profiler peak over one step) <= budget")

    probes: dict[int, Probe] = {}
    results: dict[int, Measurement] = {}
    lo, hi = 0, max_batch + 1  # lo: largest batch known to fit; hi: smallest known not to

    def probe(b: int) -> bool:
        cfg = config.replace(batch_size=b)
        m = measure(cfg, min_run_time=0, steps=steps, warmup=warmup)
        fits = (not m.oom) and m.peak_allocated is not None and m.peak_allocated <= budget_bytes
        probes[b] = Probe(b, m.peak_allocated, estimate(cfg).peak_allocated, fits, m.oom,
                          m.step_time_s, m.tokens_per_s)
        results[b] = m
        return fits

    def next_guess(b: int) -> int:
        """Secant step towards the budget from the measured peaks nearest it."""
        pts = sorted((p.batch_size, p.peak_allocated) for p in probes.values()
                     if p.peak_allocated is not None)
        if not pts or probes[b].peak_allocated is None:  # OOM without a peak: bisect
            return (lo + hi) // 2
        near = sorted(pts, key=lambda q: abs(q[1] - budget_bytes))[:2]
        slope = ((near[0][1] - near[1][1]) / (near[0][0] - near[1][0])
                 if len(near) == 2 and near[0][0] != near[1][0] else 0)
        # At small batches the peak can sit in the optimizer step, flat in the batch; the
        # estimate's bytes per sequence where activations dominate keeps the step from
        # overshooting there.
        slope = max(slope, est_slope)
        guess = b + math.floor((budget_bytes - probes[b].peak_allocated) / slope)
        if probes[b].fits and guess <= b:
            guess = b + 1  # no room predicted: check the next batch up
        return guess

    est_slope = _estimated_slope(config)
    limited = False
    try:
        if kind == "cuda":
            torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), dev)
            limited = True
        b = max(1, _predict_largest(config, budget_bytes, max_batch))
        guided = 0
        while hi - lo > 1:
            if guided >= guided_probes or not lo < b < hi or b in probes:
                # no upper bound measured yet: double; else bisect
                b = min(2 * lo, max_batch) if hi > max_batch and lo > 0 else (lo + hi) // 2
            guided += 1
            if probe(b):
                lo = b
            else:
                hi = b
            b = min(max(next_guess(b), lo + 1), hi - 1)
    finally:
        if limited:
            torch.cuda.set_per_process_memory_fraction(1.0, dev)
            torch.cuda.empty_cache()
    top = min(max(probes) + 1, max_batch) if probes else 1
    curve = [(b, estimate(config.replace(batch_size=b)).peak_allocated) for b in range(1, top + 1)]
    return BatchSearch(config=config, budget_bytes=budget_bytes, batch_size=lo,
                       measurement=results.get(lo), probes=list(probes.values()), method=method,
                       estimated=curve)


def interleaved_tokens_per_s(configs, rounds: int = 5, warmup: int = 1) -> list[float]:
    """Tokens/s of each configuration, timed in alternation so that load changes hit all alike.

    Builds every configuration's model, optimizer and data (`course_utils.training.setup`),
    runs ``warmup`` steps each, then ``rounds`` rounds of one timed optimizer step per
    configuration in turn (``torch.utils.benchmark.Timer.timeit(1)``, which synchronizes the
    accelerator; ``num_threads=torch.get_num_threads()``). Returns, per configuration,
    tokens per optimizer step / median step time. Every model stays in memory until the end:
    on a GPU their weights and optimizer states must fit together.

    Raises:
        ValueError: no configurations, or ``rounds`` / ``warmup`` below 1.
    """
    from torch.utils import benchmark

    from .training import setup

    configs = list(configs)
    if not configs:
        raise ValueError("interleaved_tokens_per_s needs at least one configuration.")
    for name, v in (("rounds", rounds), ("warmup", warmup)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}.")
    states = [setup(c) for c in configs]
    timers = []
    for st in states:
        for _ in range(warmup):
            st.step()
        timers.append(benchmark.Timer(stmt="step()", globals={"step": st.step},
                                      num_threads=torch.get_num_threads()))
    times = [[] for _ in configs]
    for _ in range(rounds):
        for i, timer in enumerate(timers):
            times[i].append(timer.timeit(1).median)
    del states, timers
    return [c.tokens_per_step / statistics.median(t) for c, t in zip(configs, times)]


# --------------------------------------------------------------------------------------------
# Memory at scale (estimates)
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GPTShape:
    """A GPT-like model shape for the memory estimator at any size (not a runnable config).

    The block is the course's (pre-LN, 4d MLP, learned positions, untied head), so the byte
    counts are exactly `course_utils.memory_model`'s formulas with this shape's vocabulary,
    sequence and width. It has the attributes `memory_model.estimate` reads, so
    ``estimate(shape)`` works.

    Attributes:
        name: a label (``"7B"``).
        n_layers, d_model, n_heads: the model's dimensions (``d_model % n_heads == 0``).
        vocab_size: vocabulary (32000, as LLaMA's tokenizer).
        seq_len, batch_size: tokens per sequence and sequences per micro-batch.
        precision: ``fp32``, ``bf16`` or ``fp16`` (PyTorch autocast: fp32 weights and grads).
        checkpoint: a checkpoint policy (``none``, ``full``, ``every-K``, ``segments:N``,
            ``selective``).
        attention: ``sdpa`` (flash/memory-efficient kernels) or ``naive``.
        device: ``cuda`` (the estimate's attention term depends on it only for naive attention).

    Raises:
        ValueError: non-positive sizes, ``d_model`` not divisible by ``n_heads``, an unknown
            precision, attention or checkpoint policy.
    """

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    vocab_size: int = 32000
    seq_len: int = 2048
    batch_size: int = 1
    precision: str = "bf16"
    checkpoint: str = "none"
    attention: str = "sdpa"
    device: str = "cuda"

    def __post_init__(self):
        check_dimensions(self, ("n_layers", "d_model", "n_heads", "vocab_size", "seq_len",
                                "batch_size"))
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}: expected one of "
                             f"{', '.join(PRECISIONS)}.")
        if self.attention not in ("sdpa", "naive"):
            raise ValueError(f"unknown attention {self.attention!r}: expected 'sdpa' or 'naive'.")
        plan_segments(self.checkpoint, self.n_layers)  # raises on an unknown policy

    def replace(self, **changes) -> "GPTShape":
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def n_parameters(self) -> int:
        """``N = 2 V d + T d + L (12 d^2 + 13 d) + 2 d`` (`memory_model.parameter_count`)."""
        from .memory_model import parameter_count
        return parameter_count(self)


#: GPT-like shapes whose parameter count comes out near their name with the course's block
#: (4d MLP, full multi-head attention) and a 32000-token vocabulary: 1.04B, 6.71B and 69.8B.
#: 7B has LLaMA-7B's 32 layers of width 4096; LLaMA-2-70B has 80 layers of width 8192 but a
#: wider MLP and grouped-query attention, so with this block 86 layers give its size.
SCALE_MODELS: dict[str, GPTShape] = {
    "1B": GPTShape("1B", n_layers=18, d_model=2048, n_heads=16),
    "7B": GPTShape("7B", n_layers=32, d_model=4096, n_heads=32),
    "70B": GPTShape("70B", n_layers=86, d_model=8192, n_heads=64),
}


def estimate_at_scale(shape: GPTShape) -> MemoryEstimate:
    """`memory_model.estimate` for a `GPTShape` (bytes; an estimate, not a measurement).

    Raises:
        ValueError: ``shape`` is not a `GPTShape`.
    """
    if not isinstance(shape, GPTShape):
        raise ValueError(f"estimate_at_scale needs a GPTShape, got {type(shape).__name__}; "
                         "for the course's runnable model use memory_model.estimate(config).")
    return estimate(shape)


#: The recipes of `scale_table`: name -> (precision, checkpoint policy).
SCALE_RECIPES = {"fp32": ("fp32", "none"),
                 "bf16 autocast": ("bf16", "none"),
                 "bf16 autocast + full ckpt": ("bf16", "full")}


def scale_table(models=None, recipes=None, seq_len: int = 2048,
                batch_size: int = 1) -> pd.DataFrame:
    """Estimated memory of one training step (AdamW) per model and recipe, in GiB.

    Args:
        models: ``{name: GPTShape}`` (default `SCALE_MODELS`).
        recipes: ``{name: (precision, checkpoint)}`` (default: fp32; bf16 autocast; bf16
            autocast + full checkpointing).
        seq_len, batch_size: tokens per sequence and sequences per micro-batch.

    Returns:
        One row per (model, recipe): ``model``, ``recipe``, ``params (B)`` (billions),
        ``weights``, ``gradients``, ``AdamW state``, ``weight copies`` (autocast's saved
        low-precision weight copies), ``activations`` (saved activations + the logits bucket),
        ``peak`` in GiB (2^30 bytes), and ``bytes/param`` of weights + gradients + AdamW state.
        All values are estimates (`memory_model` formulas).

    Raises:
        ValueError: empty ``models``/``recipes`` or invalid sizes.
    """
    models = SCALE_MODELS if models is None else models
    recipes = SCALE_RECIPES if recipes is None else recipes
    if not models or not recipes:
        raise ValueError("scale_table needs at least one model and one recipe.")
    rows = []
    for mname, shape in models.items():
        for rname, (precision, policy) in recipes.items():
            s = shape.replace(precision=precision, checkpoint=policy, seq_len=seq_len,
                              batch_size=batch_size)
            e = estimate_at_scale(s)
            rows.append({"model": mname, "recipe": rname,
                         "params (B)": e.n_parameters / 1e9,
                         "weights": e.parameters / GiB, "gradients": e.gradients / GiB,
                         "AdamW state": e.optimizer_state / GiB,
                         "weight copies": e.autocast_weight_copies / GiB,
                         "activations": (e.activations + e.logits) / GiB,
                         "peak": e.peak_allocated / GiB,
                         "bytes/param": (e.parameters + e.gradients + e.optimizer_state)
                         / e.n_parameters})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Committed GPU results
# --------------------------------------------------------------------------------------------

_RESULT_COLUMNS = ["run", "device", "size", "config", "step ms", "time x", "peak MiB", "peak x",
                   "saved MiB"]


def _find_results(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        if (folder / "results").is_dir():
            return folder / "results"
    return None


def committed_results(folder: str | Path | None = None) -> pd.DataFrame:
    """The GPU runs committed under ``results/*/bench.json`` (``course-bench --out``), one row
    per configuration.

    Args:
        folder: the ``results`` folder (default: ``results/`` in the working directory or the
            nearest parent that has one).

    Returns:
        Columns ``run`` (the run's folder name), ``device``, ``size``, ``config``, ``step ms``,
        ``time x``, ``peak MiB``, ``peak x``, ``saved MiB``; empty (same columns) when there is
        no run.

    Raises:
        ValueError: a ``bench.json`` that is not `course-bench` output (the file is named).
    """
    root = Path(folder) if folder is not None else _find_results(Path.cwd())
    rows = []
    for path in sorted(root.glob("*/bench.json")) if root is not None and root.is_dir() else []:
        try:
            payload = json.loads(path.read_text())
            hw = payload["hardware"]
            for r in payload["rows"]:
                meas, ratios = r["measured"], r["ratios"]
                rows.append({
                    "run": path.parent.name, "device": hw.get("name"),
                    "size": payload.get("size"), "config": r["label"],
                    "step ms": None if meas.get("step_time_s") is None
                    else meas["step_time_s"] * 1e3,
                    "time x": ratios.get("time_ratio"),
                    "peak MiB": None if meas.get("peak_allocated") is None
                    else meas["peak_allocated"] / MiB,
                    "peak x": ratios.get("peak_ratio"),
                    "saved MiB": None if meas.get("saved_total") is None
                    else meas["saved_total"] / MiB})
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path} is not course-bench output ({e!r}).") from e
    return pd.DataFrame(rows, columns=_RESULT_COLUMNS)
