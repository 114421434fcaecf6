"""The meter: saved tensors, peak memory and step time of one `RunConfig`.

`measure(config)` returns a `Measurement` whose memory fields are those of
`course_utils.memory_model.MemoryEstimate`; `course_utils.experiments.compare` shares its core
(`accept`, `prepare`, `measure_memory`, `time_in_alternation`). How each number is taken,
MPS's peak (on a CPU copy of the step) included: docs/method.md#memory, docs/method.md#time.

Over 400 lines because it is the one meter: the `Measurement` record, its check against the
estimate, the measurement core and the one out-of-memory message.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import inspect
import os
import re
import statistics
import time
import warnings
from dataclasses import dataclass, field

import torch

from . import stand_in
from .config import RunConfig, size_profile
from .data import get_batch
from .guard import check_feasible
from .hardware import HardwareInfo, detect, is_emulated
from .i18n import tr
from .memory_timeline import _optimizer_state_bytes, peak_during
from .saved_tensors import SavedTensorMeter, storage_bytes
from .step_timing import default_budget_s, interleaved, spread, steps_for_budget, time_step
from .terms import MiB, check_positive_int
from .training import setup, train_step

__all__ = ["MEMORY_FIELDS", "EMULATED_TIMING", "Measurement", "warm_up", "memory_step", "measure",
           "OutOfMemory", "GAP_TOLERANCE", "EstimateGap", "estimate_gaps", "report_gaps",
           "Accepted", "accept", "new_measurement", "prepare", "measure_memory",
           "time_in_alternation", "ran_out_of_memory", "describe_out_of_memory",
           "out_of_memory_message", "noting_out_of_memory", "compile_failed",
           "noting_failed_compile"]

#: Memory fields (bytes) shared by `Measurement` and `MemoryEstimate`.
MEMORY_FIELDS = ("parameters", "gradients", "optimizer_state", "activations",
                 "autocast_weight_copies", "logits", "peak_allocated")

#: How the time of an emulated precision is taken, in words (`measure_memory`).
EMULATED_TIMING = ("1 step, the one profiled for memory: this precision is emulated here, so its "
                   "time is not the speed of real hardware")

#: The exception type of an accelerator out-of-memory error in this torch.
OutOfMemory = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError


@dataclass
class Measurement:
    """What one configuration measured, in bytes and seconds: the memory fields of
    `MEMORY_FIELDS` (None where not measurable, ``peak_method`` and ``saved_method`` say how or
    why), CUDA's ``peak_reserved``, every timed step in ``step_times_s`` with their median
    ``step_time_s`` and IQR ``step_time_iqr_s``, ``tokens_per_s``, ``emulated`` (the precision
    is emulated here), ``timing`` (how, in words), ``oom``, ``error`` and ``notes``."""

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
    saved_method: str = ""
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

    @property
    def rounds(self) -> int:
        """How many steps were timed (each round of an alternation times one)."""
        return len(self.step_times_s)

    def add_times(self, times) -> None:
        """Append timed steps (seconds) and update the median, IQR and tokens/s."""
        self.step_times_s.extend(float(t) for t in times)
        if self.step_times_s:
            self.step_time_s = statistics.median(self.step_times_s)
            self.step_time_iqr_s = spread(self.step_times_s)
            self.tokens_per_s = self.config.tokens_per_step / self.step_time_s

    def as_row(self) -> dict:
        """A flat dict for a table: the config's label and fields, then the measured values."""
        row = {"label": self.config.label,
               **{k: v for k, v in self.config.as_dict().items() if k != "seed"}}
        row.update({f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                    if f.name not in ("config", "notes", "step_times_s")})
        return {**row, "saved_total": self.saved_total, "timed_rounds": self.rounds,
                "notes": " ".join(self.notes)}


# --- measured against estimated --------------------------------------------------------------

#: How far a measurement may differ from the estimate (fraction of it) before the learner is
#: told: saved tensors match it byte for byte (tests/test_saved_tensors.py), 10 % leaves room for
#: a GPU's attention kernel; the peak also holds allocator and library workspaces.
GAP_TOLERANCE = {"saved_total": 0.10, "peak_allocated": 0.25}

#: Set to 1 (tests, support matrix), this environment variable turns a gap into an error.
STRICT_ENV = "COURSE_STRICT_ESTIMATES"


class EstimateGap(UserWarning):
    """A measurement differs from the analytic estimate by more than `GAP_TOLERANCE`."""


def estimate_gaps(m: "Measurement", est, tolerance: dict | None = None) -> list[str]:
    """Sentences for each memory field where ``m`` differs from the estimate ``est`` (a
    `MemoryEstimate`) by more than ``tolerance`` (fraction per field; default `GAP_TOLERANCE`),
    e.g. ``"saved tensors: measured 0.27 MiB, estimated 0.58 MiB (-54 %)"``; not for fields not
    measured, nor ``memory-budget`` (its estimate is only the budget's fraction)."""
    if m.config.checkpoint.startswith("memory-budget") or m.oom:
        return []
    out = []
    for name, tol in (tolerance or GAP_TOLERANCE).items():
        got, want = getattr(m, name), getattr(est, name)
        if got is None or not want:
            continue
        rel = got / want - 1
        if abs(rel) > tol:
            what = tr("saved tensors") if name == "saved_total" else tr("peak allocated memory")
            out.append(tr("{what}: measured {measured:.2f} MiB, estimated {estimated:.2f} MiB "
                          "({gap:+.0%})", what=what, measured=got / MiB, estimated=want / MiB,
                          gap=rel))
    return out


def report_gaps(m: "Measurement", est) -> list[str]:
    """Tell the learner when ``m`` and its estimate disagree: each gap becomes a note of ``m``
    and an `EstimateGap` warning (shown under the cell); with ``COURSE_STRICT_ESTIMATES=1``
    (tests, support matrix) a gap raises AssertionError instead. Returns the gaps."""
    gaps = estimate_gaps(m, est)
    if gaps:
        msg = tr("{label}: the measurement differs from the analytic estimate; {gaps}. torch "
                 "{torch}: either the meter or the estimate is wrong here, so do not trust this "
                 "row's memory figures.", label=m.config.label, gaps="; ".join(gaps),
                 torch=torch.__version__)
        if os.environ.get(STRICT_ENV) == "1":
            raise AssertionError(msg)
        m.notes.append(msg)
        warnings.warn(msg, EstimateGap, stacklevel=3)
    return gaps


# --- measure(): one configuration ---------------------------------------------------------

def _free_memory(device: str) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def warm_up(state, steps: int = 1, tiny: bool = False, max_steps: int = 8) -> None:
    """Run ``steps`` optimizer steps so that AdamW's state exists (up to ``max_steps`` while
    GradScaler skips steps on inf/NaN gradients). ``tiny``: on one short sequence, where a step
    is slow (emulated precisions); a compiled model warms up at its own batch (it specialises)."""
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
    """Run one step of ``state`` and measure its memory: ``{field: bytes}`` for
    `MEMORY_FIELDS` (the saved tensors of its first forward; None where not measurable), plus
    ``peak_reserved``, ``peak_method``, ``saved_method`` and ``step_s`` (seconds of the step,
    profiler included on a CPU)."""
    cfg = state.config
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
        if cfg.device_type == "cuda":
            dev = torch.device(cfg.device)
            _free_memory(cfg.device)
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            base, base_res = torch.cuda.memory_allocated(dev), torch.cuda.memory_reserved(dev)
            out["step_s"] = time_step(state.step, cfg.device)
            out["peak_allocated"] = params + opt_state + int(
                torch.cuda.max_memory_allocated(dev) - base)
            out["peak_reserved"] = int(torch.cuda.max_memory_reserved(dev) - base_res)
            out["peak_method"] = tr("CUDA allocator: parameters + optimizer state + "
                                    "max_memory_allocated above the step's start")
        elif cfg.device_type == "cpu":
            t0 = time.perf_counter()
            peak, _ = peak_during(state.step, "cpu")
            out["step_s"] = time.perf_counter() - t0
            out["peak_allocated"] = params + opt_state + peak
            out["peak_method"] = tr("CPU: parameters + optimizer state + torch.profiler "
                                    "memory-event peak over one step")
        else:  # MPS: no peak-memory counter
            out["step_s"] = time_step(state.step, cfg.device)
            out["peak_allocated"] = _cpu_peak(state)
            out["peak_method"] = tr("CPU fallback, MPS has no peak-memory counter: parameters + "
                                    "optimizer state + torch.profiler memory-event peak over "
                                    "one step of a copy of the model on the CPU")
    finally:
        leave()
        for h in handles:
            h.remove()
    if meter.unmeasured:  # never a silently wrong number: None, with the reason
        out.update(dict.fromkeys(("activations", "autocast_weight_copies", "logits")))
        out["saved_method"] = tr("not measured here: {why}", why=meter.unmeasured)
    else:
        out.update(meter.totals())
        out["saved_method"] = tr("saved-tensor hooks, by storage (+ selective checkpointing's "
                                 "cache)")
    out["gradients"] = sum(grads.values())
    return out


def _cpu_peak(state) -> int:
    """Peak bytes of one step of ``state`` on a CPU copy of it (the dashboard's step counter,
    a ``__wrapped__`` wrapper, unwrapped so the copy's step is not counted)."""
    cfg = state.config
    module = copy.deepcopy(state.module).to("cpu")
    model = torch.compile(module) if cfg.compile else module
    position = {id(p): i for i, p in enumerate(state.module.parameters())}
    params = list(module.parameters())
    groups = [{**{k: v for k, v in g.items() if k != "params"},
               "params": [params[position[id(p)]] for p in g["params"]]}
              for g in state.optimizer.param_groups]
    optimizer = type(state.optimizer)(groups)
    optimizer.load_state_dict(state.optimizer.state_dict())  # moves the state to the CPU
    scaler = torch.amp.GradScaler("cpu", enabled=state.scaler.is_enabled(),
                                  **({"init_scale": state.scaler.get_scale()}
                                     if state.scaler.is_enabled() else {}))
    batches = [(x.to("cpu"), y.to("cpu")) for x, y in state.next_micro_batches()]
    step_fn = inspect.unwrap(state.step_fn)
    base = storage_bytes(module.parameters()) + _optimizer_state_bytes(optimizer)
    peak, _ = peak_during(lambda: step_fn(model, optimizer, scaler, batches, cfg.dtype,
                                          state.max_grad_norm), "cpu")
    return base + peak


# --- the measurement core, shared by measure() and compare() -----------------------------------

@dataclass(frozen=True)
class Accepted:
    """A ``config`` the run guard accepted (`accept`) on ``hw`` (its `HardwareInfo`), with the
    guard's ``notes`` for the learner (e.g. that bf16 is emulated on this CPU)."""

    config: RunConfig
    hw: HardwareInfo
    notes: tuple = ()

    @property
    def emulated(self) -> bool:
        """The precision only runs by emulation here (`course_utils.hardware.is_emulated`)."""
        return is_emulated(self.hw, self.config.precision)


def accept(config: RunConfig | Accepted, hw: HardwareInfo | None = None, *,
           force: bool = False) -> Accepted:
    """The run guard's one check of ``config`` (`course_utils.guard.check_feasible`), before
    anything runs; an `Accepted` is returned as it is.

    Raises:
        ValueError: a device this machine lacks, or a configuration the guard refuses (unless
            ``force``; `course_utils.guard.MemoryRefused` for memory).
    """
    if isinstance(config, Accepted):
        return config
    hw = hw or detect(config.device)
    return Accepted(config, hw, tuple(check_feasible(config, hw, force=force)))


def new_measurement(accepted: Accepted) -> Measurement:
    """An empty `Measurement` of an accepted configuration: its device, the guard's notes and
    whether the precision is emulated here."""
    return Measurement(config=accepted.config, device_name=accepted.hw.name,
                       notes=list(accepted.notes), emulated=accepted.emulated)


def ran_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` says that memory ran out: torch's `OutOfMemory` (CUDA, MPS), or the CPU
    allocator's ``RuntimeError`` ("can't allocate memory": torch gives it no type of its own)."""
    return isinstance(error, OutOfMemory) or (
        isinstance(error, RuntimeError) and "can't allocate memory" in str(error))


#: A size as torch's allocators print it: ``"24.00 MiB"``, ``"256.00 MB"`` (MPS, binary units).
_SIZE = r"([0-9.]+) ?(bytes|KiB|MiB|GiB|TiB|KB|MB|GB|TB)"
_UNIT = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
         "KB": 2**10, "MB": 2**20, "GB": 2**30, "TB": 2**40}
#: What the course reads from the allocators' out-of-memory text, a pattern around one size each.
_OOM_FIELDS = {"asked": r"[Tt]ried to allocate " + _SIZE,
               "allowed": r"max allowed: " + _SIZE + "|" + _SIZE + r" allowed",
               "allocated": _SIZE + r" is allocated by PyTorch",
               "cached": _SIZE + r" is reserved by PyTorch but unallocated",
               "total": r"total capacity of " + _SIZE,
               "free": r"of which " + _SIZE + r" is free"}


def _bytes_text(n: int) -> str:
    """Bytes as torch prints an allocation: GiB or MiB with two decimals, else bytes."""
    if n >= 2**30:
        return f"{n / 2**30:,.2f} GiB"
    return f"{n / MiB:.2f} MiB" if n >= MiB else f"{n:,} bytes"


def _first_sentence(text: str, limit: int = 160) -> str:
    """An error's first sentence on one line, at most ``limit`` characters."""
    first = " ".join(text.split()).split(". ")[0].rstrip(".")
    return first if len(first) <= limit else first[:limit - 3] + "..."


def _oom_facts(text: str) -> dict:
    """``{field: bytes or None}`` for `_OOM_FIELDS` found in an out-of-memory error's text."""
    facts = {}
    for name, pattern in _OOM_FIELDS.items():
        found = re.search(pattern, text)
        groups = [g for g in (found.groups() if found else ()) if g is not None]
        facts[name] = int(float(groups[0]) * _UNIT[groups[1]]) if groups else None
    return facts


def _cap_words(allowed: int | None) -> str:
    """What capped the allocator, after "beyond": a stand-in's memory, a budget, a cap, or ""."""
    card = stand_in.active()
    if card is not None:
        theirs = tr("the {size} of the {card} this GPU stands in for",
                    size=_bytes_text(card.memory_bytes), card=card.name)
        if allowed is None or abs(allowed - card.memory_bytes) <= 0.01 * card.memory_bytes:
            return theirs
        return tr("the {size} this process's allocator may hold (a budget inside {theirs})",
                  size=_bytes_text(allowed), theirs=theirs)
    return "" if allowed is None else tr("the {size} this process's allocator may hold",
                                         size=_bytes_text(allowed))


def describe_out_of_memory(error: BaseException) -> str:
    """What ran out, on one line, read from torch's message (CUDA, MPS, the CPU allocator):
    ``"the step asked for 24.00 MiB more with 1.17 GiB already reserved by PyTorch, beyond the
    14.75 GiB of the Tesla T4 this GPU stands in for"``, never torch's whole text (under
    `course_utils.stand_in` it names the real GPU); else the message's first sentence."""
    text = " ".join(str(error).split())
    facts = _oom_facts(text)
    if facts["asked"] is None:
        return _first_sentence(text) or tr("out of memory")
    held = (facts["allocated"] or 0) + (facts["cached"] or 0)
    words = (tr("the step asked for {asked} more with {held} already reserved by PyTorch",
                asked=_bytes_text(facts["asked"]), held=_bytes_text(held)) if held
             else tr("the step asked for {asked} more", asked=_bytes_text(facts["asked"])))
    cap = _cap_words(facts["allowed"])
    if cap:
        return tr("{words}, beyond {cap}", words=words, cap=cap)
    if facts["total"] is not None and facts["free"] is not None:
        return tr("{words}, and {free} of the device's {total} was free", words=words,
                  free=_bytes_text(facts["free"]), total=_bytes_text(facts["total"]))
    if "CPUAllocator" in text:
        return tr("{words}, more than the RAM left", words=words)
    return words


def out_of_memory_message(config, hw_name: str, error: BaseException, when: str = "") -> str:
    """The course's one out-of-memory message, on one line: ``"out of memory on <hw_name> at
    batch 32, seq 512 (fp16)<when>: <describe_out_of_memory(error)>. Try a smaller batch ..."``
    for any ``config`` with ``batch_size``, ``label`` and maybe ``seq_len``; ``when``:
    `TOGETHER` or "", translated where the catalog has it."""
    seq = getattr(config, "seq_len", None)
    where = (tr("at batch {batch}, seq {seq}", batch=config.batch_size, seq=seq) if seq
             else tr("at batch {batch}", batch=config.batch_size))
    return tr("out of memory on {device} {where} ({label}){when}: {what}. Try a smaller batch "
              "or sequence, a low precision, or a checkpoint policy such as 'full'.",
              device=hw_name, where=where, label=config.label, when=tr(when),
              what=describe_out_of_memory(error))


@contextlib.contextmanager
def noting_out_of_memory(m: Measurement, when: str = ""):
    """Inside the block, running out of memory marks ``m`` (``oom``, ``error``) instead of
    raising; any other error passes through."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - re-raised unless it is an out-of-memory error
        if not ran_out_of_memory(e):
            raise
        m.oom, m.error = True, out_of_memory_message(m.config, m.device_name, e, when)


def compile_failed(error: BaseException) -> bool:
    """Whether ``error`` was raised by torch.compile's stack (``torch._dynamo``,
    ``torch._inductor``): e.g. no working C++ compiler, or a GPU without Triton."""
    return any(c.__module__.startswith(("torch._dynamo", "torch._inductor"))
               for c in type(error).__mro__)


def _compiles(config) -> bool:
    """``config`` runs through torch.compile: ``compile=True`` or the ``memory-budget`` policy."""
    return bool(getattr(config, "compile", False)) or \
        str(getattr(config, "checkpoint", "")).startswith("memory-budget")


@contextlib.contextmanager
def noting_failed_compile(m: Measurement):
    """Inside the block, torch.compile failing for a configuration that compiles marks ``m``
    (``error`` says it is not measured here) instead of raising; other errors pass through."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - re-raised unless torch.compile failed
        if not (_compiles(m.config) and compile_failed(e)):
            raise
        m.error = tr("torch.compile failed here ({error}: {first}): {label} is not measured "
                     "here", error=type(e).__name__, first=_first_sentence(str(e)),
                     label=m.config.label)


def prepare(config: RunConfig, hw: HardwareInfo, step_fn=train_step, warmup: int = 1):
    """The `course_utils.training.TrainState` of ``config``, warmed up (`warm_up`: on a tiny
    batch where the precision is emulated on ``hw``, a CPU)."""
    state = setup(config, step_fn=step_fn)
    warm_up(state, warmup, tiny=is_emulated(hw, config.precision) and hw.device == "cpu")
    return state


def measure_memory(m: Measurement, accepted: Accepted, step_fn=train_step, *, warmup: int = 1,
                   time_emulated: bool = True):
    """Set-up, warm-up and one memory step of ``accepted`` (`memory_step`), written into ``m``;
    where the precision is emulated and ``time_emulated``, that step is its one timed step
    (`EMULATED_TIMING`). Returns the live training state for timing, or None after an error
    (marked in ``m``) or an emulated step."""
    state = None
    with noting_out_of_memory(m), noting_failed_compile(m):
        state = prepare(accepted.config, accepted.hw, step_fn, warmup)
        mem = memory_step(state)
        profiled_s = mem.pop("step_s")
        for k, v in mem.items():
            setattr(m, k, v)
        if time_emulated and m.emulated:  # the fewest steps that give a number: none more
            m.add_times([profiled_s])
            m.timing = tr(EMULATED_TIMING)
            state = None
    if m.oom or m.error:
        state = None
        _free_memory(accepted.config.device)
    return state


def time_in_alternation(ms: list, states: list, budget_s: float | None, rounds: int | None, *,
                        device: str, progress=None) -> None:
    """Time ``states[i].step`` for ``ms[i]`` in alternation (`step_timing.interleaved`: about
    ``budget_s`` seconds, or exactly ``rounds``) and add the times to each measurement. Running
    out of memory with every model alive leaves each "not timed", with the reason in ``error``."""
    try:
        times = interleaved([st.step for st in states], budget_s if rounds is None else None,
                            rounds=rounds, progress=progress, device=device)
    except Exception as e:  # noqa: BLE001 - re-raised unless it is an out-of-memory error
        if not ran_out_of_memory(e):
            raise
        times = [[] for _ in states]
        for m in ms:
            m.error = out_of_memory_message(m.config, m.device_name, e, TOGETHER)
    for m, t in zip(ms, times):
        m.add_times(t)
        m.timing = (tr("{n} steps in alternation with the other rows", n=len(t)) if t
                    else tr("not timed"))


#: What `time_in_alternation`'s out-of-memory message adds.
TOGETHER = " while timing the configurations together (compare fewer at a time)"


def measure(config: RunConfig | Accepted, *, budget_s: float | None = None,
            steps: int | None = None, warmup: int = 1, timed: bool = True, force: bool = False,
            step_fn=train_step, hw=None) -> Measurement:
    """Measure one configuration: memory breakdown, peak, and step time.

    Args:
        config: what to run on a fresh model; an `Accepted` is not checked again.
        budget_s: seconds of timed steps (default `default_budget_s` of the size profile);
            ``steps``: time exactly this many instead; ``timed=False``: memory only.
        warmup: optimizer steps before measuring (>= 1: AdamW's state must exist).
        force: run configurations that `course_utils.guard.check_feasible` refuses.
        step_fn: the training step; hw: the `HardwareInfo` of ``config.device``.

    Returns:
        A `Measurement`, with one step timed where the precision is emulated here; an
        out-of-memory error or a failed compile sets its ``error`` instead of raising.

    Raises:
        ValueError: bad ``steps``, ``warmup`` or ``budget_s``, a device this machine lacks, or
            a configuration `check_feasible` refuses (unless ``force``).
    """
    check_positive_int("steps", steps, allow_none=True)
    check_positive_int("warmup", warmup)
    if budget_s is not None and not budget_s > 0:
        raise ValueError(tr("budget_s must be > 0 seconds, got {budget_s!r}.", budget_s=budget_s))
    accepted = accept(config, hw, force=force)
    config = accepted.config
    m = new_measurement(accepted)
    try:
        state = measure_memory(m, accepted, step_fn, warmup=warmup,
                               time_emulated=timed and steps is None)
        if timed and state is not None:
            with noting_out_of_memory(m), noting_failed_compile(m):
                if steps is None:
                    budget = budget_s or default_budget_s(size_profile())
                    first = time_step(state.step, config.device)
                    n = steps_for_budget(first, budget) - 1
                    m.add_times([first] + [time_step(state.step, config.device) for _ in range(n)])
                    m.timing = tr("{n} steps (a budget of {budget:g} s)", n=n + 1, budget=budget)
                else:  # a list first: a step that runs out of memory adds no time at all
                    m.add_times([time_step(state.step, config.device) for _ in range(steps)])
                    m.timing = tr("1 step") if steps == 1 else tr("{n} steps", n=steps)
    finally:
        state = None
        _free_memory(config.device)
    return m
