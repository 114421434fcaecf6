"""The training step the course teaches, and the state that runs it. `train_step` (lessons 01 and
03 show its text) is one code path for every precision, as nanoGPT's ``GradScaler(enabled=(dtype
== 'float16'))`` (PyTorch "Automatic Mixed Precision" recipe); without a scaler it skips a step
whose gradient norm is inf/NaN, since one NaN gradient otherwise turns every parameter into NaN
through the clipping and AdamW (lesson 01 §6). `StepCounter` counts the steps really taken.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
from tqdm.auto import tqdm

from .checkpointing import CompiledUnderBudget
from .config import RunConfig
from .data import batches, get_batch
from .guard import check_feasible
from .i18n import tr
from .models import build_model
from .terms import check_positive_int

__all__ = ["DEFAULT_LR", "DEFAULT_MAX_GRAD_NORM", "train_step", "StepCounter",
           "TrainState", "setup", "train", "TrainHistory", "evaluate"]

DEFAULT_LR = 1e-3
DEFAULT_MAX_GRAD_NORM = 1.0


def train_step(model, optimizer, scaler, micro_batches, dtype=None, max_grad_norm=1.0,
               nonfinite="skip"):
    """One optimizer step over micro_batches, a list of (x, y) int64 (B, T) pairs.

    dtype: torch.bfloat16 or torch.float16 for autocast, None for fp32. scaler: a
    torch.amp.GradScaler, enabled only for fp16. nonfinite: without a scaler, a step whose
    gradient norm is inf/NaN is skipped ("skip"), raises ("raise") or is taken ("step").
    Returns the mean loss (0-dim tensor).
    """
    if nonfinite not in ("skip", "raise", "step"):
        raise ValueError(f"nonfinite must be 'skip', 'raise' or 'step', got {nonfinite!r}.")
    total = 0.0
    for x, y in micro_batches:
        with torch.autocast(x.device.type, dtype=dtype, enabled=dtype is not None):
            _, loss = model(x, y)                     # checkpointed blocks recompute in backward
        loss = loss / len(micro_batches)              # accumulation: average, not sum
        scaler.scale(loss).backward()                 # fp16: loss x S; otherwise unchanged
        total += loss.detach()
    scaler.unscale_(optimizer)                        # before clipping: clip the true gradients
    guard = "step" if scaler.is_enabled() else nonfinite   # fp16: GradScaler's own skip
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm,
                                          error_if_nonfinite=guard == "raise")
    if guard != "skip" or norm.isfinite():            # the test of the norm: one host sync
        scaler.step(optimizer)                        # fp16: skipped if a gradient is inf/NaN
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return total


class StepCounter(contextlib.AbstractContextManager):
    """Counts in ``taken`` the ``optimizer.step()`` calls that ran (a step skipped by GradScaler
    or `train_step`'s guard did not), with ``Optimizer.register_step_post_hook``. Use as a
    context manager, or call `remove` when done."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.taken = 0
        self._handle = optimizer.register_step_post_hook(self._count)

    def _count(self, optimizer, args, kwargs) -> None:
        self.taken += 1

    def remove(self) -> None:
        """Stop counting."""
        self._handle.remove()

    def __exit__(self, *exc) -> None:
        self.remove()


@dataclass
class TrainState:
    """Everything a step needs: the config, the ``module`` and the ``model`` that runs (the same
    module, its blocks compiled in place when ``config.compile``), AdamW, the GradScaler (fp16
    only), the data stream, and ``step_fn``, the step `step` runs (default `train_step`)."""

    config: RunConfig
    module: torch.nn.Module
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    data: object
    lr: float = DEFAULT_LR
    max_grad_norm: float = DEFAULT_MAX_GRAD_NORM
    step_fn: Callable = field(default=train_step, repr=False)

    def next_micro_batches(self) -> list:
        """The next ``grad_accum_steps`` micro-batches."""
        return [next(self.data) for _ in range(self.config.grad_accum_steps)]

    def step(self) -> torch.Tensor:
        """One optimizer step on the next micro-batches; returns the loss tensor."""
        return self.step_fn(self.model, self.optimizer, self.scaler, self.next_micro_batches(),
                            self.config.dtype, self.max_grad_norm)


def setup(config: RunConfig, lr: float = DEFAULT_LR,
          max_grad_norm: float = DEFAULT_MAX_GRAD_NORM, step_fn: Callable = train_step,
          data=None) -> TrainState:
    """Build ``config``'s model, AdamW (fp32 moments, 8 bytes/parameter), a GradScaler enabled for
    fp16 only and the ``data`` stream of ``(x, y)`` micro-batches (default `batches`).

    Raises:
        ValueError: ``config.device`` is not available here.
    """
    module = build_model(config)
    model = compile_blocks(module) if config.compile else module
    optimizer = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=0.1)
    scaler = torch.amp.GradScaler(config.device_type, enabled=config.precision == "fp16")
    return TrainState(config, module, model, optimizer, scaler,
                      batches(config) if data is None else data, lr, max_grad_norm, step_fn)


def compile_blocks(model: torch.nn.Module) -> torch.nn.Module:
    """Compile each unit of ``model.layers`` in place with ``torch.compile`` and return
    ``model``: the identical blocks share one graph, so compiling costs about one block's compile
    (PyTorch recipe "Reducing torch.compile cold start compilation time with regional
    compilation"). A unit that compiles itself (policy ``memory-budget``) is left as it is.

    Raises:
        ValueError: ``model`` has no ``layers``.
    """
    layers = getattr(model, "layers", None)
    if layers is None:
        raise ValueError(tr("compile_blocks needs a model with .layers (the course's GPT); got "
                            "{type}.", type=type(model).__name__))
    for unit in layers:
        if not isinstance(unit, CompiledUnderBudget):
            unit.compile()
    return model


@torch.no_grad()
def evaluate(state: TrainState, n_batches: int = 4) -> float:
    """Mean validation loss (nats per byte) over ``n_batches`` fixed validation batches, under
    the config's autocast."""
    cfg = state.config
    state.model.eval()
    losses = []
    for i in range(n_batches):
        x, y = get_batch(cfg.batch_size, cfg.seq_len, "val", cfg.seed, i, cfg.device)
        with cfg.autocast():
            _, loss = state.model(x, y)
        losses.append(loss.float().item())
    state.model.train()
    return sum(losses) / len(losses)


@dataclass
class TrainHistory:
    """What `train` recorded: losses in nats per byte, GradScaler's scale after each step (fp16
    only) and the ``skipped`` steps (inf/NaN gradients)."""

    config: RunConfig
    steps: list = field(default_factory=list)
    train_loss: list = field(default_factory=list)
    val_steps: list = field(default_factory=list)
    val_loss: list = field(default_factory=list)
    scales: list = field(default_factory=list)
    skipped: list = field(default_factory=list)


def train(config: RunConfig, steps: int, eval_every: int = 50, eval_batches: int = 4,
          lr: float = DEFAULT_LR, progress: bool = True, force: bool = False) -> TrainHistory:
    """Train ``config``'s model for ``steps`` optimizer steps on the text corpus, with a tqdm
    bar; validation loss at step 0, every ``eval_every`` steps and at the end.

    Raises:
        ValueError: a count < 1, a device this machine lacks, or a configuration
            `course_utils.guard.check_feasible` refuses, unless ``force``.
    """
    for name, v in (("steps", steps), ("eval_every", eval_every), ("eval_batches", eval_batches)):
        check_positive_int(name, v)
    check_feasible(config, force=force)
    state = setup(config, lr=lr)
    hist = TrainHistory(config)
    hist.val_steps.append(0)
    hist.val_loss.append(evaluate(state, eval_batches))
    with StepCounter(state.optimizer) as counter:
        for i in tqdm(range(1, steps + 1), desc=config.label, disable=not progress, leave=False):
            taken = counter.taken
            loss = state.step()
            hist.steps.append(i)
            hist.train_loss.append(loss.float().item())
            if state.scaler.is_enabled():
                hist.scales.append(state.scaler.get_scale())
            if counter.taken == taken:
                hist.skipped.append(i)
            if i % eval_every == 0 or i == steps:
                hist.val_steps.append(i)
                hist.val_loss.append(evaluate(state, eval_batches))
    return hist
