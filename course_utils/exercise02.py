"""The given helpers of exercise 02 (activation checkpointing), importable instead of pasted.

The exercise's learner writes a forward that checkpoints every k-th block, a segment-count rule and
a selective checkpointing policy; the tests check them with these helpers. Each helper takes the
blocks and the input explicitly (no notebook globals), so the same call works in the exercise, in
the grader's kernel and in ``tests/``:

* `forward_plain(blocks, x)`: the plain forward, lesson 02's `run_blocks`;
* `forward_full(blocks, x)`: every block checkpointed on its own (policy ``full``);
* `forward_selective(blocks, x, policy)`: every block checkpointed with a selective
  checkpointing ``policy`` (``context_fn``);
* `checkpoint_every_segment(blocks, x, n_segments)`: lesson 02's loop (the library's, with its
  one segment rule `course_utils.checkpointing.segment_bounds`);
* `gradients`, `forward_calls`, `kept_after_forward`, `matmul_flops`: what the tests compare
  (gradients, forward calls per block, bytes kept after the forward, matmul FLOPs).
"""
from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
from torch.utils.flop_counter import FlopCounterMode

from .checkpointing import checkpoint_every_segment, run_blocks
from .timeline import allocated_after

__all__ = [
    "MATMULS",
    "checkpoint_every_segment",
    "forward_calls",
    "forward_full",
    "forward_plain",
    "forward_selective",
    "gradients",
    "kept_after_forward",
    "matmul_flops",
]

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
    """Every block checkpointed with the selective checkpointing ``policy``: the outputs the
    policy saves are kept, the rest is recomputed in backward."""
    context_fn = functools.partial(create_selective_checkpoint_contexts, policy)
    for block in blocks:
        x = checkpoint(block, x, use_reentrant=False, context_fn=context_fn)
    return x


def _check(blocks, x, needs_grad: bool = False) -> None:
    if not isinstance(blocks, torch.nn.Module):
        raise TypeError(f"blocks should be the nn.ModuleList (or nn.Sequential) of blocks, got "
                        f"{type(blocks).__name__}.")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x should be a tensor of shape (batch, seq, d_model), got "
                        f"{type(x).__name__}.")
    if needs_grad and not x.requires_grad:
        raise ValueError("x should require grad (its gradient is compared too): use the "
                         "exercise's x, made with requires_grad=True.")


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
    (wherever it keeps it: autograd or selective checkpointing's cache) plus its output
    (`course_utils.timeline.allocated_after`; None on a device without a memory counter)."""
    _check(blocks, x)
    out, kept = allocated_after(lambda: forward(blocks, x, *args), x.device)
    del out
    return kept


def matmul_flops(forward, blocks, x: torch.Tensor, *args) -> int:
    """Matmul FLOPs (`MATMULS`) of ``forward(blocks, x, *args)`` + backward, counted by
    ``torch.utils.flop_counter.FlopCounterMode``: exact, the same on every machine."""
    _check(blocks, x)
    blocks.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False) as counter:
        forward(blocks, x, *args).sum().backward()
    return sum(v for op, v in counter.get_flop_counts()["Global"].items() if str(op) in MATMULS)
