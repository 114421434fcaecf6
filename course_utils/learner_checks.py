"""Checks of a learner's code from the outside, importable by the graded exercises, the grader's
kernel and ``tests/`` alike (no notebook globals: every helper takes what it checks). Exercise 02
(activation checkpointing): reference forwards and what the tests compare of a forward. Exercise
03 (the production step): what a step hands its optimizer (`step_gradients`).
"""
from __future__ import annotations

import contextlib
import functools
import math

import torch
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
from torch.utils.flop_counter import FlopCounterMode

from .checkpointing import checkpoint_every_segment, run_blocks
from .i18n import tr
from .memory_timeline import allocated_after
from .saved_tensors import SavedTensorMeter

__all__ = ["MATMULS", "StepProbe", "checkpoint_every_segment", "forward_calls", "forward_full",
           "forward_plain", "forward_selective", "gradients", "kept_after_forward", "matmul_flops",
           "relative_error", "step_gradients"]

#: The plain forward: ``x`` through ``blocks`` in order, nothing checkpointed (`run_blocks`).
forward_plain = run_blocks

#: The matrix-multiplication ops whose FLOPs `matmul_flops` adds up (as FlopCounterMode names them).
MATMULS = ("aten.mm", "aten.addmm", "aten.bmm")


def forward_full(blocks, x: torch.Tensor) -> torch.Tensor:
    """Every block checkpointed on its own (non-reentrant): only the block inputs stay saved."""
    for block in blocks:
        x = checkpoint(block, x, use_reentrant=False)
    return x


def forward_selective(blocks, x: torch.Tensor, policy) -> torch.Tensor:
    """Every block checkpointed with the selective checkpointing ``policy`` (``context_fn``)."""
    context_fn = functools.partial(create_selective_checkpoint_contexts, policy)
    for block in blocks:
        x = checkpoint(block, x, use_reentrant=False, context_fn=context_fn)
    return x


def _check(blocks, x, needs_grad: bool = False) -> None:
    if not isinstance(blocks, torch.nn.Module):
        raise TypeError(tr("blocks should be the nn.ModuleList (or nn.Sequential) of blocks, got "
                           "{type}.", type=type(blocks).__name__))
    if not isinstance(x, torch.Tensor):
        raise TypeError(tr("x should be a tensor of shape (batch, seq, d_model), got {type}.",
                           type=type(x).__name__))
    if needs_grad and not x.requires_grad:
        raise ValueError(tr("x should require grad (its gradient is compared too): use the "
                            "exercise's x, made with requires_grad=True."))


def gradients(forward, blocks, x: torch.Tensor, *args) -> list[torch.Tensor]:
    """The gradients of ``blocks``' parameters and of ``x`` (last) after
    ``forward(blocks, x, *args).pow(2).mean().backward()``, as fresh tensors.

    Raises:
        TypeError: ``blocks`` is not a module or ``x`` not a tensor.
        ValueError: ``x`` does not require grad.
    """
    _check(blocks, x, needs_grad=True)
    blocks.zero_grad(set_to_none=True)
    x.grad = None
    forward(blocks, x, *args).pow(2).mean().backward()
    return [p.grad.clone() for p in blocks.parameters()] + [x.grad.clone()]


def forward_calls(forward, blocks, x: torch.Tensor, *args) -> list[int]:
    """How many times each block's forward runs during ``forward(blocks, x, *args)`` and its
    backward: 1 for a plain block, 2 for a checkpointed one (recomputed in backward)."""
    _check(blocks, x)
    counts = [0] * len(blocks)
    hooks = [b.register_forward_pre_hook(lambda *_, i=i: counts.__setitem__(i, counts[i] + 1))
             for i, b in enumerate(blocks)]
    try:
        forward(blocks, x, *args).sum().backward()
    finally:
        for h in hooks:
            h.remove()
    return counts


def kept_after_forward(forward, blocks, x: torch.Tensor, *args) -> int | None:
    """Bytes still allocated when ``forward(blocks, x, *args)`` returns: what it keeps for backward
    (in autograd or selective checkpointing's cache) plus its output (`allocated_after`; None on
    a device without a memory counter)."""
    _check(blocks, x)
    return allocated_after(lambda: forward(blocks, x, *args), x.device)[1]


def matmul_flops(forward, blocks, x: torch.Tensor, *args) -> int:
    """Matmul FLOPs (`MATMULS`) of ``forward(blocks, x, *args)`` + backward, counted by
    ``torch.utils.flop_counter.FlopCounterMode``: exact, the same on every machine."""
    _check(blocks, x)
    blocks.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False) as counter:
        forward(blocks, x, *args).sum().backward()
    return sum(v for op, v in counter.get_flop_counts()["Global"].items() if str(op) in MATMULS)


class StepProbe(torch.optim.Optimizer):
    """An optimizer that applies nothing: ``step()`` stores a copy of every parameter's ``.grad``
    (or None) in ``grads`` unless ``record`` is False (then it allocates nothing, for peak
    measurements), and counts itself in ``steps``. GradScaler accepts it like any optimizer.
    """

    def __init__(self, params, record: bool = True):
        super().__init__(params, {})
        self.record = record
        self.grads: list | None = None
        self.steps = 0

    @torch.no_grad()
    def step(self, closure=None):
        if self.record:
            self.grads = [None if p.grad is None else p.grad.detach().clone()
                          for g in self.param_groups for p in g["params"]]
        self.steps += 1


def relative_error(got: list, want: list) -> float:
    """``max |got - want| / max |want|`` over lists of tensors (inf if one is missing or shapes
    differ)."""
    if len(got) != len(want) or any(
            (g is None) != (w is None) or (g is not None and g.shape != w.shape)
            for g, w in zip(got, want)):
        return math.inf
    pairs = [(g.float(), w.float()) for g, w in zip(got, want) if w is not None]
    if not pairs:
        return math.inf
    diff = max((g - w).abs().max().item() for g, w in pairs)
    scale = max(w.abs().max().item() for _, w in pairs)
    return diff / scale if scale else (0.0 if diff == 0 else math.inf)


def step_gradients(step_fn, model: torch.nn.Module, micro_batches, dtype=None, scaler=None,
                   max_grad_norm: float = math.inf, meter: bool = False,
                   record: bool = True) -> dict:
    """Run ``step_fn`` (`course_utils.training.train_step`'s signature) once on a fresh ``model``
    with a `StepProbe` as the optimizer (``record`` is its) and report what happened. ``scaler``
    None is a disabled GradScaler; ``meter`` also counts the bytes saved for backward
    (`SavedTensorMeter`, parameters excluded).

    Returns:
        ``{"grads": [tensor or None per parameter] the optimizer received (None if it never
        stepped), "loss": float or None, "steps": optimizer steps taken, "zeroed": every
        .grad is None afterwards, "saved": {bucket: bytes} or None}``.
    """
    device = next(model.parameters()).device
    probe = StepProbe(model.parameters(), record=record)
    scaler = scaler if scaler is not None else torch.amp.GradScaler(device.type, enabled=False)
    with SavedTensorMeter(model) if meter else contextlib.nullcontext() as m:
        loss = step_fn(model, probe, scaler, micro_batches, dtype, max_grad_norm)
    loss = loss.detach() if isinstance(loss, torch.Tensor) else loss  # float() of a grad tensor warns
    return {"grads": probe.grads, "loss": None if loss is None else float(loss),
            "steps": probe.steps, "zeroed": all(p.grad is None for p in model.parameters()),
            "saved": m.totals() if meter else None}
