"""The meter: saved tensors, peak memory and step time of one `RunConfig`.

`measure(config)` returns a `Measurement` whose memory fields have the same names as
`course_utils.memory_model.MemoryEstimate`, so "predicted vs measured" is a subtraction.

How each number is taken:

* **saved tensors** (`SavedTensorMeter`, the course's one meter):
  ``torch.autograd.graph.saved_tensors_hooks`` around a forward, deduplicated by storage (q, k
  and v are views of one ``qkv`` storage), parameters excluded; autocast's low-precision weight
  copies (a tensor whose autograd history is a chain of single-input nodes ending at a
  parameter's ``AccumulateGrad``) go to ``autocast_weight_copies``; tensors saved from the final
  LayerNorm on (head, loss) go to ``logits``. Tensors kept by selective checkpointing live in
  SAC's own cache, out of the hooks' sight; the model's `RecordingPolicy` objects report them.
  The pack hook returns ``t.detach()`` and the meter keeps no tensor: a hook that returned ``t``
  itself would close a reference cycle through autograd's C++ graph for every tensor an op saves
  as its own output, which ``gc.collect()`` cannot break, and the whole graph would leak (PyTorch
  docs, "Hooks for saved tensors").
* **peak allocated**: one training step after warm-up. CUDA: the allocator's
  ``max_memory_allocated`` above its value at the step's start; CPU: the profiler's memory events
  (`course_utils.timeline`); both added to the bytes alive at the step's start (parameters +
  optimizer state), so other models alive in the process do not count. MPS: ``None``.
* **step time**: forward + backward + optimizer step of the course's `train_step` (or a lesson's
  own step), one `course_utils.timing.time_step` per step (the accelerator synchronised); as
  many steps as fit a time budget, or one step where the precision is only emulated on this
  hardware (its time is not the speed of real hardware).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import statistics
from dataclasses import dataclass, field

import pandas as pd
import torch

from .checkpointing import recording_policies
from .config import RunConfig
from .data import get_batch
from .timeline import peak_during
from .timing import default_budget_s, spread, steps_for_budget, time_step
from .training import setup, train_step

__all__ = ["MEMORY_FIELDS", "Measurement", "SavedTensorMeter", "measure", "measure_saved",
           "saved_bytes", "saved_by_module", "storage_bytes", "OutOfMemory"]

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
        parameters, gradients, optimizer_state: bytes of the parameters, of their gradients
            after a backward, of AdamW's state (two fp32 moments + step counters).
        activations: saved-tensor bytes of the embeddings and blocks of one forward.
        autocast_weight_copies: saved low-precision copies of weights made by autocast (0 in fp32).
        logits: saved-tensor bytes of the final LayerNorm, head and loss (fp32 log-softmax).
        peak_allocated: peak bytes allocated during one step (None where the backend cannot
            tell; ``peak_method`` says how it was taken or why not).
        peak_reserved: CUDA caching-allocator peak reserved bytes above the step's start (None
            elsewhere).
        step_times_s: every timed step (seconds), in order.
        step_time_s, step_time_iqr_s: their median and interquartile range (IQR None with
            fewer than 2 steps).
        tokens_per_s: tokens per optimizer step / median step time.
        emulated: the precision is only emulated on this hardware (`hardware.is_emulated`).
        timing: how the time was taken, in words.
        oom: the run hit an out-of-memory error; ``error`` holds the message and a suggestion.
        notes: notes for the learner (e.g. bf16 emulated on this CPU).
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
    step_times_s: list = field(default_factory=list)
    step_time_s: float | None = None
    step_time_iqr_s: float | None = None
    tokens_per_s: float | None = None
    emulated: bool = False
    timing: str = ""
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

    def add_times(self, times) -> None:
        """Append timed steps (seconds) and update the median, IQR and tokens/s."""
        self.step_times_s.extend(float(t) for t in times)
        if self.step_times_s:
            self.step_time_s = statistics.median(self.step_times_s)
            self.step_time_iqr_s = spread(self.step_times_s)
            self.tokens_per_s = self.config.tokens_per_step / self.step_time_s

    def as_row(self) -> dict:
        """A flat dict for a table: the config's label and fields, then the measured values."""
        c = self.config
        row = {"label": c.label, **{k: v for k, v in c.as_dict().items() if k != "seed"}}
        for f in dataclasses.fields(self):
            if f.name not in ("config", "notes", "step_times_s"):
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
        model: its parameters are excluded; if it has ``ln_f`` (the course's GPT), tensors saved
            from its final LayerNorm on go to the ``logits`` bucket; tensors kept by its
            selective-checkpointing regions are counted as activations.
        by_module: also record, for each tensor, the innermost submodule of ``model`` whose
            forward was running when it was saved (`saved_by_module`).

    After the ``with`` block, ``totals()`` gives bytes per bucket (``activations``,
    ``autocast_weight_copies``, ``logits``) and ``records`` one dict per storage (``nbytes``,
    ``bucket``, ``shape``, ``dtype``, ``grad_fn``, ``module``, ``module_type``). The meter holds
    no tensor: what it measured is freed as soon as the caller drops it.
    """

    def __init__(self, model: torch.nn.Module | None = None, by_module: bool = False):
        self.model = model
        self.by_module = by_module
        self._params = set()
        if model is not None:
            self._params = {(str(p.device), p.untyped_storage().data_ptr())
                            for p in model.parameters()}
        self._seen: dict = {}
        self._stack: list = []
        self._policies: list = []
        self.region = "activations"
        self._exit = contextlib.ExitStack()

    def _record(self, key, nbytes, bucket, shape, dtype, grad_fn) -> None:
        if key in self._params or key in self._seen:
            return
        name, kind = (self._stack[-1] if self._stack
                      else ("", type(self.model).__name__ if self.model is not None else ""))
        self._seen[key] = {"nbytes": nbytes, "bucket": bucket, "shape": shape, "dtype": dtype,
                           "grad_fn": grad_fn, "module": name, "module_type": kind}

    def _pack(self, t):
        if not isinstance(t, torch.Tensor):
            return t
        st = t.untyped_storage()
        bucket = "autocast_weight_copies" if _is_weight_copy(t) else self.region
        self._record((str(t.device), st.data_ptr()), st.nbytes(), bucket, tuple(t.shape),
                     t.dtype, type(t.grad_fn).__name__ if t.grad_fn is not None else None)
        return t.detach()  # no reference cycle: autograd restores the saved tensor from it

    def _enter_module(self, name: str, module: torch.nn.Module):
        label = (name, type(module).__name__)

        def hook(*_):  # returns None: the module's input is left unchanged
            self._stack.append(label)
        return hook

    def _leave_module(self, *_) -> None:  # returns None: the module's output is left unchanged
        if self._stack:
            self._stack.pop()

    def __enter__(self):
        self._seen.clear()
        self.region = "activations"
        if self.model is not None:
            ln_f = getattr(self.model, "ln_f", None)
            if isinstance(ln_f, torch.nn.Module):
                h = ln_f.register_forward_pre_hook(lambda *_: setattr(self, "region", "logits"))
                self._exit.callback(h.remove)
            self._policies = recording_policies(self.model)
            for p in self._policies:
                p.kept = []
            if self.by_module:
                for name, sub in self.model.named_modules():
                    h1 = sub.register_forward_pre_hook(self._enter_module(name, sub))
                    h2 = sub.register_forward_hook(self._leave_module)
                    self._exit.callback(h1.remove)
                    self._exit.callback(h2.remove)
        self._exit.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack,
                                                                           lambda t: t))
        return self

    def __exit__(self, *exc):
        try:
            return self._exit.__exit__(*exc)
        finally:
            for p in self._policies:
                for dev, ptr, nbytes, shape, dtype in p.kept or ():
                    self._record((dev, ptr), nbytes, "activations", shape, dtype, "SAC cache")
                p.kept = None
            self._policies = []
            self._stack.clear()

    @property
    def records(self) -> list[dict]:
        """One dict per distinct storage saved, in the order they were saved."""
        return list(self._seen.values())

    def totals(self) -> dict:
        """Bytes per bucket: ``activations``, ``autocast_weight_copies``, ``logits``."""
        out = {"activations": 0, "autocast_weight_copies": 0, "logits": 0}
        for r in self._seen.values():
            out[r["bucket"]] += r["nbytes"]
        return out

    def by_dtype(self) -> pd.DataFrame:
        """Saved bytes by bucket and dtype: rows ``(bucket, dtype)`` with ``bytes``, ``MiB``
        (2^20 bytes) and ``tensors`` (distinct storages), largest first within a bucket.

        Raises:
            ValueError: the meter recorded nothing.
        """
        from .formats import short_dtype
        if not self._seen:
            raise ValueError("the meter recorded no saved tensors: run a forward inside it first.")
        df = pd.DataFrame([{"bucket": r["bucket"], "dtype": short_dtype(r["dtype"]),
                            "bytes": r["nbytes"]} for r in self._seen.values()])
        out = df.groupby(["bucket", "dtype"]).agg(bytes=("bytes", "sum"),
                                                  tensors=("bytes", "size"))
        out["MiB"] = out["bytes"] / 2**20
        return out.sort_values(["bucket", "bytes"], ascending=[True, False])[
            ["bytes", "MiB", "tensors"]]


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
    """Run one forward of the course's GPT under ``precision``'s autocast; return the filled
    meter. The forward's graph is freed before returning (no backward is run).

    Raises:
        ValueError: an unknown precision.
    """
    from .config import autocast_dtype
    dtype = autocast_dtype(precision)
    with SavedTensorMeter(model) as meter:
        with torch.autocast(x.device.type, dtype=dtype, enabled=dtype is not None):
            _, loss = model(x, y)
    del loss
    return meter


def saved_by_module(module: torch.nn.Module, fn) -> pd.DataFrame:
    """The tensors autograd saves for backward while ``fn()`` runs, one row per storage.

    Args:
        module: its parameters are excluded; each saved tensor is attributed to the innermost
            of its submodules (names as in ``module.named_modules()``, ``""`` for ``module``
            itself) whose forward was running.
        fn: a function of no arguments that runs a forward through ``module``.

    Returns:
        A DataFrame in the order the tensors were saved, columns ``module``, ``module_type``,
        ``shape``, ``dtype`` (str), ``nbytes`` (bytes of the storage), ``grad_fn`` (the node
        that made the tensor, ``None`` for a leaf). The forward's graph is freed on return.

    Raises:
        TypeError: ``module`` is not a ``torch.nn.Module``.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"saved_by_module needs a torch.nn.Module, got {type(module).__name__}.")
    with SavedTensorMeter(module, by_module=True) as meter:
        out = fn()
    del out
    cols = ["module", "module_type", "shape", "dtype", "nbytes", "grad_fn"]
    rows = [{**{c: r[c] for c in cols}, "dtype": str(r["dtype"]).replace("torch.", "")}
            for r in meter.records]
    return pd.DataFrame(rows, columns=cols)


# --- measure(): one configuration ---------------------------------------------------------

def _optimizer_state_bytes(optimizer) -> int:
    return storage_bytes(v for st in optimizer.state.values() for v in st.values()
                         if isinstance(v, torch.Tensor))


def _free_memory(device: str) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def warm_up(state, steps: int = 1, tiny: bool = False, max_steps: int = 8) -> None:
    """Run ``steps`` optimizer steps so that AdamW's state exists (more, up to ``max_steps``,
    while GradScaler skips steps on inf/NaN gradients and no state has been made).

    ``tiny``: warm up on a batch of one short sequence instead of the config's batch (enough
    to create the optimizer state; used where a full step is slow: emulated precisions on a
    CPU). Compiled models always warm up at the config's batch (compilation specialises).
    """
    cfg = state.config
    tiny = tiny and not cfg.compile
    done = 0
    while done < steps or (not state.optimizer.state and done < max_steps):
        if tiny:
            x, y = get_batch(1, min(cfg.seq_len, 16), seed=cfg.seed, step=10_000 + done,
                             device=cfg.device)
            state.step_fn(state.model, state.optimizer, state.scaler, [(x, y)], cfg.dtype,
                          state.max_grad_norm)
        else:
            state.step()
        done += 1


def memory_step(state) -> dict:
    """Run one step of ``state`` and measure its memory: the saved tensors of its first
    forward, the gradient bytes, the optimizer state and the peak (see the module docstring).

    Returns:
        ``{field: bytes}`` for `MEMORY_FIELDS`, plus ``peak_reserved`` and ``peak_method``.
    """
    cfg = state.config
    kind = cfg.device_type
    meter = SavedTensorMeter(state.module)
    grads: dict = {}
    first = {"open": False, "done": False}

    def enter(*_):
        if not first["done"] and not first["open"]:
            meter.__enter__()
            first["open"] = True

    def leave(*_):
        if first["open"]:
            meter.__exit__(None, None, None)
            first["open"], first["done"] = False, True

    def grad_seen(p):
        grads[id(p)] = p.grad.untyped_storage().nbytes() if p.grad is not None else 0

    handles = [state.model.register_forward_pre_hook(enter),
               state.model.register_forward_hook(leave)]
    handles += [p.register_post_accumulate_grad_hook(grad_seen)
                for p in state.module.parameters() if p.requires_grad]
    params = storage_bytes(state.module.parameters())
    opt_state = _optimizer_state_bytes(state.optimizer)
    out = {"parameters": params, "optimizer_state": opt_state, "peak_reserved": None}
    try:
        if kind == "cuda":
            dev = torch.device(cfg.device)
            _free_memory(cfg.device)
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            base, base_res = torch.cuda.memory_allocated(dev), torch.cuda.memory_reserved(dev)
            state.step()
            torch.cuda.synchronize(dev)
            out["peak_allocated"] = params + opt_state + int(
                torch.cuda.max_memory_allocated(dev) - base)
            out["peak_reserved"] = int(torch.cuda.max_memory_reserved(dev) - base_res)
            out["peak_method"] = ("CUDA allocator: parameters + optimizer state + "
                                  "max_memory_allocated above the step's start")
        elif kind == "cpu":
            peak, _ = peak_during(state.step, "cpu")
            out["peak_allocated"] = params + opt_state + peak
            out["peak_method"] = ("CPU: parameters + optimizer state + torch.profiler "
                                  "memory-event peak over one step")
        else:
            state.step()
            out["peak_allocated"] = None
            out["peak_method"] = "not available: MPS has no peak-memory counter"
    finally:
        leave()
        for h in handles:
            h.remove()
    out.update(meter.totals())
    out["gradients"] = sum(grads.values())
    return out


def _check_count(name: str, v, allow_none: bool = True, minimum: int = 1) -> None:
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v!r}.")


def measure(config: RunConfig, *, budget_s: float | None = None, steps: int | None = None,
            warmup: int = 1, timed: bool = True, force: bool = False, step_fn=train_step,
            hw=None) -> Measurement:
    """Measure one configuration: memory breakdown, peak, and step time.

    Args:
        config: what to run (a fresh model is built, seeded by ``config.seed``).
        budget_s: seconds of timed steps (default `course_utils.timing.default_budget_s` of
            the size profile in force); a calibration step decides how many fit.
        steps: time exactly this many steps instead.
        warmup: optimizer steps before measuring (>= 1: AdamW's state must exist; on a CPU
            they run on a tiny batch where the precision is emulated).
        timed: False measures memory only (one step).
        force: run configurations that `course_utils.hardware.check_feasible` refuses.
        step_fn: the training step (default `course_utils.training.train_step`).
        hw: the `HardwareInfo` of ``config.device`` (default: detected).

    Returns:
        A `Measurement`. Where the precision is emulated on this hardware, one step is timed
        and ``emulated`` is True. On an accelerator out-of-memory error it is marked
        ``oom=True`` with the message and a suggestion in ``error``; memory is released and no
        exception escapes.

    Raises:
        ValueError: ``steps`` or ``warmup`` not a positive integer, a non-positive
            ``budget_s``, a device this machine lacks, or a configuration `check_feasible`
            refuses (unless ``force``).
    """
    from .config import size_profile
    from .hardware import check_feasible, detect, is_emulated
    _check_count("steps", steps)
    _check_count("warmup", warmup, allow_none=False)
    if budget_s is not None and not budget_s > 0:
        raise ValueError(f"budget_s must be > 0 seconds, got {budget_s!r}.")
    hw = hw or detect(config.device)
    notes = check_feasible(config, hw, force=force)
    emulated = is_emulated(hw, config.precision)
    m = Measurement(config=config, device_name=hw.name, notes=list(notes), emulated=emulated)
    state = None
    try:
        state = setup(config, step_fn=step_fn)
        warm_up(state, warmup, tiny=emulated and hw.device == "cpu")
        for k, v in memory_step(state).items():
            setattr(m, k, v)
        if timed:
            if steps is None and emulated:
                steps = 1
                m.timing = ("1 step: this precision is emulated here, so its time is not the "
                            "speed of real hardware")
            if steps is None:
                budget = budget_s or default_budget_s(size_profile())
                first = time_step(state.step, config.device)
                n = steps_for_budget(first, budget) - 1
                m.add_times([first] + [time_step(state.step, config.device) for _ in range(n)])
                m.timing = f"{n + 1} steps (a budget of {budget:g} s)"
            else:
                m.add_times(time_step(state.step, config.device) for _ in range(steps))
                m.timing = m.timing or f"{steps} step{'s' * (steps != 1)}"
    except OutOfMemory as e:
        m.oom = True
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else "out of memory"
        m.error = (f"out of memory on {hw.name} at batch {config.batch_size}, seq "
                   f"{config.seq_len}: {first_line}. Try a smaller batch or sequence, a low "
                   "precision, or a checkpoint policy such as 'full'.")
    finally:
        state = None
        _free_memory(config.device)
    return m
