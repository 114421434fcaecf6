"""The meter: step time, peak memory and saved-activation bytes of one `RunConfig`.

`measure(config)` returns a `Measurement` whose memory fields have the same names as
`course_utils.memory_model.MemoryEstimate`, so "predicted vs measured" is a subtraction.

How each number is taken (DESIGN.md "Measuring"; shared/notes/measurement.md):

* **step time**: forward + backward + optimizer step (+ scaler update) of the reference loop,
  median and interquartile range of ``torch.utils.benchmark.Timer.blocked_autorange`` after
  warm-up, with ``num_threads=torch.get_num_threads()`` (the Timer's default is 1) and device
  synchronisation (the Timer does it).
* **saved activations**: ``torch.autograd.graph.saved_tensors_hooks`` around one forward,
  deduplicated by storage (q, k, v are views of one ``qkv`` storage), parameters excluded;
  autocast's low-precision weight copies (a tensor whose autograd history is a chain of
  single-input nodes ending at a parameter's ``AccumulateGrad``) go to
  ``autocast_weight_copies``; tensors saved from the final LayerNorm on (head, loss) go to
  ``logits``. Tensors kept by selective checkpointing live outside autograd's graph; the course's
  SAC policy reports them (`course_utils.checkpointing.SAC_SAVE_LISTENERS`).
* **peak allocated**: CUDA: ``reset_peak_memory_stats`` -> step -> ``synchronize`` ->
  ``max_memory_allocated`` (and ``max_memory_reserved``). CPU: the profiler's memory events
  (``profile_memory=True``; running sum of allocation sizes over one step, in time order) added to
  the bytes alive at the step's start (parameters + optimizer state). MPS: ``None`` (no peak API).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import statistics
from dataclasses import dataclass, field

import torch
from torch.utils import benchmark

from . import checkpointing
from .config import RunConfig, autocast_dtype, check_feasible
from .timeline import peak_bytes
from .training import device_type, setup

__all__ = ["MEMORY_FIELDS", "Measurement", "SavedTensorMeter", "measure", "measure_saved",
           "saved_bytes", "storage_bytes", "OutOfMemory"]

#: Memory fields (bytes) shared by `Measurement` and `MemoryEstimate`.
MEMORY_FIELDS = ("parameters", "gradients", "optimizer_state", "activations",
                 "autocast_weight_copies", "logits", "peak_allocated")

#: The exception type of an accelerator out-of-memory error in this torch.
OutOfMemory = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError


@dataclass
class Measurement:
    """What one configuration measured. Bytes are bytes; times are seconds.

    Attributes:
        config: the `RunConfig` measured.
        parameters, gradients, optimizer_state: bytes of the model's parameters, of their
            gradients after a backward, of AdamW's state (two fp32 moments + step counters).
        activations: saved-tensor bytes of the embeddings and blocks after one forward.
        autocast_weight_copies: saved low-precision copies of weights made by autocast (0 in fp32).
        logits: saved-tensor bytes of the final LayerNorm, head and loss (fp32 log-softmax).
        peak_allocated: peak bytes allocated during one step (None where the backend cannot
            tell; ``peak_method`` says how it was taken or why not).
        peak_reserved: CUDA caching-allocator peak reserved bytes (None elsewhere).
        step_time_s, step_time_iqr_s: median step time and its interquartile range.
        tokens_per_s: tokens per optimizer step / median step time.
        oom: the run hit an out-of-memory error; ``error`` holds the message and a suggestion.
        notes: warnings for the learner (e.g. bf16 on a CPU without bf16 instructions).
    """

    config: RunConfig
    parameters: int | None = None
    gradients: int | None = None
    optimizer_state: int | None = None
    activations: int | None = None
    autocast_weight_copies: int | None = None
    logits: int | None = None
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    peak_method: str = ""
    step_time_s: float | None = None
    step_time_iqr_s: float | None = None
    tokens_per_s: float | None = None
    device_name: str = ""
    torch_version: str = torch.__version__
    oom: bool = False
    error: str | None = None
    notes: list = field(default_factory=list)

    @property
    def saved_total(self) -> int | None:
        """All saved-tensor bytes: activations + autocast weight copies + logits."""
        parts = (self.activations, self.autocast_weight_copies, self.logits)
        return None if any(p is None for p in parts) else sum(parts)

    def as_row(self) -> dict:
        """A flat dict for a table: the config's label and fields, then the measured values."""
        c = self.config
        row = {"label": c.label, "precision": c.precision, "checkpoint": c.checkpoint,
               "compile": c.compile, "batch_size": c.batch_size, "seq_len": c.seq_len,
               "n_layers": c.n_layers, "d_model": c.d_model,
               "grad_accum_steps": c.grad_accum_steps, "device": c.device}
        for f in dataclasses.fields(self):
            if f.name not in ("config", "notes"):
                row[f.name] = getattr(self, f.name)
        row["saved_total"] = self.saved_total
        row["notes"] = " ".join(self.notes)
        return row


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views counted once)."""
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            seen[(str(t.device), st.data_ptr())] = st.nbytes()
    return sum(seen.values())


def _is_weight_copy(t: torch.Tensor, max_depth: int = 6) -> bool:
    """True if ``t`` comes from a parameter through single-input ops only (cast, transpose)."""
    node = t.grad_fn
    for _ in range(max_depth):
        if node is None:
            return False
        nexts = [n for n, _ in node.next_functions if n is not None]
        if len(nexts) != 1:
            return False
        if type(nexts[0]).__name__ == "AccumulateGrad":
            return True
        node = nexts[0]
    return False


class SavedTensorMeter:
    """Context manager that records the tensors autograd saves for backward, by storage.

    Args:
        model: parameters of this module are excluded; if it has ``ln_f`` (the course's GPT),
            tensors saved from its final LayerNorm on are put in the ``logits`` bucket.

    After the ``with`` block, ``totals()`` gives bytes per bucket (``activations``,
    ``autocast_weight_copies``, ``logits``) and ``records`` lists each storage once as
    ``(nbytes, bucket, shape, dtype, grad_fn name)``.
    """

    def __init__(self, model: torch.nn.Module | None = None):
        self.model = model
        self._params = set()
        if model is not None:
            self._params = {(str(p.device), p.untyped_storage().data_ptr())
                            for p in model.parameters()}
        self._seen: dict = {}
        self.region = "activations"
        self._stack = contextlib.ExitStack()

    def _add(self, t: torch.Tensor, bucket: str | None = None) -> None:
        st = t.untyped_storage()
        key = (str(t.device), st.data_ptr())
        if key in self._params or key in self._seen:
            return
        if bucket is None:
            bucket = "autocast_weight_copies" if _is_weight_copy(t) else self.region
        name = type(t.grad_fn).__name__ if t.grad_fn is not None else None
        self._seen[key] = (st.nbytes(), bucket, tuple(t.shape), t.dtype, name)

    def _pack(self, t):
        if isinstance(t, torch.Tensor):
            self._add(t)
        return t

    def _sac_listener(self, out) -> None:
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                self._add(t)

    def __enter__(self):
        self._seen.clear()
        self.region = "activations"
        ln_f = getattr(self.model, "ln_f", None) if self.model is not None else None
        if ln_f is not None:
            h = ln_f.register_forward_pre_hook(lambda *_: setattr(self, "region", "logits"))
            self._stack.callback(h.remove)
        checkpointing.SAC_SAVE_LISTENERS.append(self._sac_listener)
        self._stack.callback(checkpointing.SAC_SAVE_LISTENERS.remove, self._sac_listener)
        self._stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t))
        return self

    def __exit__(self, *exc):
        return self._stack.__exit__(*exc)

    @property
    def records(self) -> list:
        return list(self._seen.values())

    def totals(self) -> dict:
        """Bytes per bucket: ``activations``, ``autocast_weight_copies``, ``logits``."""
        out = {"activations": 0, "autocast_weight_copies": 0, "logits": 0}
        for nbytes, bucket, *_ in self._seen.values():
            out[bucket] += nbytes
        return out


def saved_bytes(fn, *args, model: torch.nn.Module | None = None, **kwargs) -> int:
    """Saved-tensor bytes (deduplicated, parameters of ``model`` excluded) of ``fn(*args)``.

    For any callable, e.g. ``saved_bytes(checkpoint_sequential, layers, 3, x,
    use_reentrant=False, model=layers)``. The output is discarded after counting.
    """
    with SavedTensorMeter(model) as meter:
        out = fn(*args, **kwargs)
    del out
    return sum(meter.totals().values())


def measure_saved(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                  precision: str = "fp32") -> SavedTensorMeter:
    """Run one forward of the course's GPT under autocast and return the filled meter.

    The forward's graph is freed before returning (no backward is run).
    """
    dtype = autocast_dtype(precision)
    with SavedTensorMeter(model) as meter:
        with torch.autocast(device_type(x.device), dtype=dtype, enabled=dtype is not None):
            _, loss = model(x, y)
    del loss
    return meter


def _optimizer_state_bytes(optimizer) -> int:
    tensors = [v for st in optimizer.state.values() for v in st.values()
               if isinstance(v, torch.Tensor)]
    return storage_bytes(tensors)


def _sync(device: str) -> None:
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def _free_memory(device: str) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def measure(config: RunConfig, min_run_time: float = 1.0, warmup: int = 2,
            force: bool = False, steps: int | None = None) -> Measurement:
    """Measure one configuration: memory breakdown, peak, and step time.

    Args:
        config: what to run (a fresh model is built, seeded by ``config.seed``).
        min_run_time: seconds of timed steps (``Timer.blocked_autorange``); 0 skips timing.
        steps: time exactly this many single steps instead (median and IQR over them).
        warmup: optimizer steps before measuring (creates AdamW's state; compiles if asked).
        force: run configurations that `check_feasible` refuses.

    Returns:
        A `Measurement`. On an accelerator out-of-memory error it is marked ``oom=True`` with the
        message and a suggestion in ``error``; memory is released and no exception escapes.

    Raises:
        ValueError: a configuration `check_feasible` refuses (unless ``force``), or a device
            this machine lacks.
    """
    from .hardware import detect
    hw = detect(config.device)
    notes = check_feasible(config, hw, force=force)
    m = Measurement(config=config, device_name=hw.name, notes=list(notes))
    dev = config.device
    state = None
    try:
        state = setup(config)
        params = list(state.module.parameters())
        m.parameters = storage_bytes(params)

        # 1. Saved tensors of one forward, then one backward for the gradient bytes.
        x, y = next(state.data)
        meter = measure_saved(state.model, x, y, config.precision)
        totals = meter.totals()
        m.activations = totals["activations"]
        m.autocast_weight_copies = totals["autocast_weight_copies"]
        m.logits = totals["logits"]
        del meter

        # 2. Warm-up steps: AdamW's state appears after the first step.
        for _ in range(max(1, warmup)):
            state.step()
        _sync(dev)
        m.gradients = _gradient_bytes(state)
        m.optimizer_state = _optimizer_state_bytes(state.optimizer)

        # 3. Peak memory of one step.
        kind = torch.device(dev).type
        if kind == "cuda":
            _free_memory(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            state.step()
            torch.cuda.synchronize(dev)
            m.peak_allocated = int(torch.cuda.max_memory_allocated(dev))
            m.peak_reserved = int(torch.cuda.max_memory_reserved(dev))
            m.peak_method = "CUDA allocator: max_memory_allocated over one step"
        elif kind == "cpu":
            alive = m.parameters + m.optimizer_state
            m.peak_allocated = alive + peak_bytes(state.step, "cpu")
            m.peak_method = ("CPU: parameters + optimizer state + torch.profiler memory-event "
                             "peak over one step")
        else:
            m.peak_method = "not available: MPS has no peak-memory counter"

        # 4. Step time.
        timer = benchmark.Timer(stmt="step()", globals={"step": state.step},
                                num_threads=torch.get_num_threads(), label=config.label)
        if steps:
            times = [timer.timeit(1).median for _ in range(steps)]
            m.step_time_s = float(statistics.median(times))
            q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
            m.step_time_iqr_s = float(q[2] - q[0])
        elif min_run_time > 0:
            t = timer.blocked_autorange(min_run_time=min_run_time)
            m.step_time_s = float(t.median)
            m.step_time_iqr_s = float(t.iqr) if not math.isnan(t.iqr) else 0.0
        if m.step_time_s:
            m.tokens_per_s = config.tokens_per_step / m.step_time_s
    except OutOfMemory as e:
        m.oom = True
        first = str(e).strip().splitlines()[0] if str(e).strip() else "out of memory"
        m.error = (f"out of memory on {hw.name} at batch {config.batch_size}, seq "
                   f"{config.seq_len}: {first}. Try a smaller batch or sequence, bf16/fp16, or a "
                   "checkpoint policy such as 'full'.")
    finally:
        state = None
        _free_memory(dev)
    return m


def _gradient_bytes(state) -> int:
    """Bytes of all parameter gradients after one forward + backward (then freed)."""
    x, y = next(state.data)
    dtype = autocast_dtype(state.config.precision)
    with torch.autocast(device_type(x.device), dtype=dtype, enabled=dtype is not None):
        _, loss = state.model(x, y)
    loss.backward()
    n = storage_bytes(p.grad for p in state.module.parameters() if p.grad is not None)
    state.optimizer.zero_grad(set_to_none=True)
    return n
