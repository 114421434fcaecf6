"""The reference training step: autocast, GradScaler (fp16 only), clipping, accumulation.

This is the loop the lessons write out in their cells; the engine uses this copy so that a
measurement times exactly the recipe the course teaches (PyTorch "Automatic Mixed Precision"
recipe and ``torch.amp`` docs):

1. forward + loss under ``torch.autocast(device_type, dtype)`` (no autocast for fp32);
2. the loss divided by the number of micro-batches (gradient accumulation);
3. ``scaler.scale(loss).backward()`` for fp16, plain ``backward()`` otherwise;
4. ``scaler.unscale_(optimizer)`` *before* ``clip_grad_norm_`` (clip the true gradients);
5. ``scaler.step`` + ``scaler.update`` (fp16) or ``optimizer.step``;
6. ``optimizer.zero_grad(set_to_none=True)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from .config import RunConfig, autocast_dtype
from .data import batches, get_batch
from .models import build_model

__all__ = ["TrainState", "setup", "train_step", "train", "TrainHistory", "evaluate"]

DEFAULT_LR = 1e-3
DEFAULT_MAX_GRAD_NORM = 1.0


def device_type(device: str | torch.device) -> str:
    """``"cuda"`` for ``"cuda:1"``, etc.: what ``torch.autocast`` and ``GradScaler`` take."""
    return torch.device(device).type


def train_step(model, optimizer, micro_batches, precision: str, scaler=None,
               max_grad_norm: float | None = DEFAULT_MAX_GRAD_NORM) -> torch.Tensor:
    """One optimizer step over ``micro_batches`` (a list of ``(x, y)`` int64 ``(B, T)`` pairs).

    Returns:
        The step's loss (mean over micro-batches) as a 0-dim tensor (not synchronised).

    Raises:
        ValueError: an unknown precision, fp16 without a scaler, or no micro-batches.
    """
    dtype = autocast_dtype(precision)
    if not micro_batches:
        raise ValueError("train_step needs at least one micro-batch.")
    if precision == "fp16" and scaler is None:
        raise ValueError("fp16 training needs a torch.amp.GradScaler (loss scaling); pass scaler=.")
    dev = device_type(micro_batches[0][0].device)
    n = len(micro_batches)
    total = torch.zeros((), device=micro_batches[0][0].device)
    for x, y in micro_batches:
        with torch.autocast(dev, dtype=dtype, enabled=dtype is not None):
            _, loss = model(x, y)
        loss = loss / n  # accumulation: the sum of n micro-batch grads is the mean's grad
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        total += loss.detach()
    if scaler is not None:
        scaler.unscale_(optimizer)  # before clipping: clip the real gradients, not scaled ones
    if max_grad_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    if scaler is not None:
        scaler.step(optimizer)  # skipped if any gradient is inf/NaN
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


@dataclass
class TrainState:
    """Everything a step needs: the model (``module``: uncompiled; ``model``: what runs),
    optimizer, scaler (fp16 only), the data stream and the config."""

    config: RunConfig
    module: torch.nn.Module
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: "torch.amp.GradScaler | None"
    data: object
    lr: float = DEFAULT_LR
    max_grad_norm: float | None = DEFAULT_MAX_GRAD_NORM

    def next_micro_batches(self) -> list:
        """The next ``grad_accum_steps`` micro-batches."""
        return [next(self.data) for _ in range(self.config.grad_accum_steps)]

    def step(self) -> torch.Tensor:
        """One optimizer step on the next micro-batches; returns the loss tensor."""
        return train_step(self.model, self.optimizer, self.next_micro_batches(),
                          self.config.precision, self.scaler, self.max_grad_norm)


def setup(config: RunConfig, lr: float = DEFAULT_LR,
          max_grad_norm: float | None = DEFAULT_MAX_GRAD_NORM) -> TrainState:
    """Build model, AdamW optimizer, GradScaler (fp16 only) and data for ``config``.

    AdamW keeps fp32 moments (8 bytes/parameter) whatever the autocast precision.
    """
    module = build_model(config)
    model = torch.compile(module) if config.compile else module
    optimizer = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=0.1)
    scaler = (torch.amp.GradScaler(device_type(config.device))
              if config.precision == "fp16" else None)
    return TrainState(config, module, model, optimizer, scaler, batches(config), lr, max_grad_norm)


@torch.no_grad()
def evaluate(state: TrainState, n_batches: int = 4) -> float:
    """Mean validation loss over ``n_batches`` fixed validation batches (same autocast)."""
    cfg = state.config
    dtype = autocast_dtype(cfg.precision)
    state.model.eval()
    losses = []
    for i in range(n_batches):
        x, y = get_batch(cfg.batch_size, cfg.seq_len, "val", cfg.seed, i, cfg.device)
        with torch.autocast(device_type(cfg.device), dtype=dtype, enabled=dtype is not None):
            _, loss = state.model(x, y)
        losses.append(loss.float().item())
    state.model.train()
    return sum(losses) / len(losses)


@dataclass
class TrainHistory:
    """What `train` recorded. Losses are floats (nats per byte); ``scales`` holds GradScaler's
    scale after each step (fp16 only) and ``skipped`` the steps it skipped (inf/NaN grads)."""

    config: RunConfig
    steps: list = field(default_factory=list)
    train_loss: list = field(default_factory=list)
    val_steps: list = field(default_factory=list)
    val_loss: list = field(default_factory=list)
    scales: list = field(default_factory=list)
    skipped: list = field(default_factory=list)


def train(config: RunConfig, steps: int, eval_every: int = 50, eval_batches: int = 4,
          lr: float = DEFAULT_LR, progress: bool = True) -> TrainHistory:
    """Train ``config``'s model for ``steps`` optimizer steps on the text corpus.

    Shows a tqdm progress bar (``progress=False`` hides it). Validation loss is measured at step
    0, every ``eval_every`` steps and at the end.

    Raises:
        ValueError: ``steps`` < 1.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}.")
    state = setup(config, lr=lr)
    hist = TrainHistory(config)
    hist.val_steps.append(0)
    hist.val_loss.append(evaluate(state, eval_batches))
    for i in tqdm(range(1, steps + 1), desc=config.label, disable=not progress, leave=False):
        before = state.scaler.get_scale() if state.scaler is not None else None
        loss = state.step()
        hist.steps.append(i)
        hist.train_loss.append(loss.float().item())
        if state.scaler is not None:
            after = state.scaler.get_scale()
            hist.scales.append(after)
            if after < before:
                hist.skipped.append(i)
        if i % eval_every == 0 or i == steps:
            hist.val_steps.append(i)
            hist.val_loss.append(evaluate(state, eval_batches))
    return hist
